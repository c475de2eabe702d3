"""`python -m runner`: the Hydra entry point. Compose, check, freeze, make the run dir, launch, report.

A plain run composes the config once and runs it through Hydra's own `run_job` (the `@hydra.main` path composes
twice: once only to learn the mode). Everything else Hydra offers on the command line (`-m`, `--cfg`, `--info`,
`--help`, `--shell-completion`, a config that sets `hydra.mode=MULTIRUN`) goes through Hydra's standard entry
unchanged, with the same task function.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hydra_plugins import runner_optuna_sweeper as optuna_sweeper
from runner.run import rundir
from runner.config import RunConfig
from runner.distributed.dist import adopt_slurm_tasks, skypilot_machine_overrides, writes_run_dir
from runner.errors import (
    INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, ConfigError, Preempted, RunnerError, exit_with, no_stray_tracebacks,
    print_error, write_error,
)
from runner.launch.launcher import launch
from runner.run.compose import (
    CONFIG_DIR, CONFIG_NAME, callback_problems, composition_error, freeze, logging_problems, preflight,
    swap_recipe_groups, sweep_problems, task_overrides, with_group_origin, with_recipe, with_sources,
)
from runner.launch.worker import console_from_rank_zero_only, missing_final_artifacts
from runner.sweep.report import finished_result, refuse_other_jobs_dir
from runner.launch.shutdown import skip_collection_at_exit
from runner.sweep.callback import refuse_search_under_torchrun
from runner.distributed.signals import hand_over_to_submitit, stop_during_startup, submitit_takes_over

log = logging.getLogger("runner")


# Flags that ask Hydra for something other than running: its standard entry handles them.
NOT_A_RUN = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun")


# `runner WORD ...` (also `python -m runner WORD ...`): the runner's other commands, with the line `runner --help`
# shows for each. A word without `=` is never a Hydra override, so these cannot clash with one.
COMMANDS = {
    "recipes": ("runner.commands.recipes", "list, show, copy or validate recipes (runner recipes list)"),
    "launch": ("runner.launch.launcher", "run your own script on this machine's processes, like accelerate launch"),
    "machine": ("runner.commands.machine", "this machine's defaults: hardware, processes, gpu_ids, precision"),
    "plan": ("runner.commands.plan", "memory per process, batch and steps of a run, before running it"),
    "sample": ("runner.commands.sample", "generate text from a trained language model's run dir"),
    "env": ("runner.commands.env", "versions and devices, to paste into a bug report"),
}


def commands_help() -> str:
    width = max(len(word) for word in COMMANDS)
    lines = [f"  runner {word:<{width}}  {summary}" for word, (_, summary) in COMMANDS.items()]
    return "\n".join([
        "usage: runner [OVERRIDES]          train: a recipe and its groups, e.g. runner recipe=gpt precision=bf16",
        "       runner -m OVERRIDES         a sweep (Hydra multirun), e.g. runner -m optimizer.lr=1e-3,3e-4",
        "       runner COMMAND [ARGS]       one of:",
        *lines,
        "(python -m runner works the same way; the config help follows)",
        "",
    ])


def console_main() -> None:
    """The `runner` console script: `python -m runner`, with the working directory importable as it is under
    `python -m` (so a recipe's `_target_: mylab.models.Net` finds the user's own package there)."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    main()


def main(argv: list[str] | None = None) -> None:
    from hydra._internal.utils import get_args_parser

    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["--version"]:  # Hydra's own flag would print only Hydra's version
        from importlib import metadata

        import hydra

        print(f"runner-ml {metadata.version('runner-ml')} (Hydra {hydra.__version__})")
        return
    if arguments and arguments[0] in COMMANDS:
        import importlib

        code = importlib.import_module(COMMANDS[arguments[0]][0]).main(arguments[1:])
        if code:
            raise SystemExit(code)
        return
    no_stray_tracebacks()
    skip_collection_at_exit()
    adopt_slurm_tasks()  # srun's tasks become the ranks before anything reads RANK (the run dir, the lock)
    parser = get_args_parser()
    args = parser.parse_intermixed_args(arguments)  # `k=v -cd DIR k=v` as well as options first
    args.overrides += skypilot_machine_overrides(args.overrides)  # a SkyPilot task's nodes are the machines
    if args.help:  # the commands first, as `accelerate --help` lists its own; then Hydra's config help
        print(commands_help())
    if any(getattr(args, flag, None) for flag in NOT_A_RUN):
        return _hydra_entry(args, parser)
    _run(args, parser)


def _to_log_files(text: str) -> None:
    """A line for the run's log file (runner.log) only: the console has just said it in its own format."""
    record = logging.LogRecord(log.name, logging.WARNING, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _hydra_entry(args, parser) -> None:
    """Hydra's own entry (what @hydra.main calls): sweeps, --cfg, --info, --help, shell completion."""
    from hydra._internal.utils import _run_hydra

    _run_hydra(args=args, args_parser=parser, task_function=hydra_task, config_path=CONFIG_DIR,
               config_name=CONFIG_NAME)


def hydra_task(cfg: DictConfig) -> float:
    """The task function of a job started by Hydra's sweeper (one job of `-m`)."""
    return run_task(cfg)


def _run(args, parser) -> None:
    """Compose once and check what Hydra itself will build (its callbacks). A sweep then goes on through Hydra's
    sweeper; one run is decided here: its run dir, before anything is written, then the job, as Hydra.run does."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log

    config_name = args.config_name or CONFIG_NAME
    mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
    try:
        try:
            hydra = Hydra.create_main_hydra2(task_name="runner", config_search_path=search_path(args))
            # Logging configured below, once its config has passed the checks (dictConfig imports what it names).
            cfg = hydra.compose_config(config_name, args.overrides, run_mode=mode, with_log_configuration=False,
                                       validate_sweep_overrides=mode is RunMode.RUN)
        except Exception as err:  # Hydra's and OmegaConf's composition errors: the message says it all
            exit_with(composition_error(err, args.overrides))
        problems = [*logging_problems(cfg), *callback_problems(cfg)]
        if problems:
            exit_with(ConfigError(problems))
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)  # as compose_config(with_log_configuration=True)
        if args.multirun or cfg.hydra.mode == RunMode.MULTIRUN:  # -m, or e.g. hparams_search=...: a sweep
            # Here, from the one composition, not in a sweep callback: Hydra composes twice more before its
            # callbacks run, seconds in which torchrun may already be ending this rank for its peer's refusal.
            refuse_search_under_torchrun(cfg)
            problems = sweep_problems(cfg, args.overrides)
            if problems:
                exit_with(ConfigError(problems))
            if OmegaConf.select(cfg, "hydra.sweeper._target_") == optuna_sweeper.PLUGIN_TARGET:
                # the plugin's class, but a search in which no trial completed ends in one paragraph
                args.overrides.append(f"hydra.sweeper._target_={optuna_sweeper.TARGET}")
            GlobalHydra.instance().clear()
            return _hydra_entry(args, parser)
        _run_one(hydra, cfg, config_name)
    finally:
        GlobalHydra.instance().clear()


def _run_one(hydra, cfg: DictConfig, config_name: str) -> None:
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    cfg.hydra.mode = RunMode.RUN
    try:
        HydraConfig.instance().set_config(cfg)
        run_dir = rundir.inspect(Path(str(OmegaConf.select(cfg, "hydra.run.dir"))))
        if writes_run_dir(OmegaConf.select(cfg, "hardware.machine_rank", default=0)):
            run_dir.lock()  # before Hydra writes .hydra/ into it: a run already in there keeps its record
    except (RunnerError, OmegaConfBaseException) as err:
        exit_with(err if isinstance(err, RunnerError) else composition_error(err, []))
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    try:
        ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                      task_function=lambda task_cfg: run_task(task_cfg, run_dir), config=cfg,
                      job_dir_key="hydra.run.dir", job_subdir_key=None)
    except OSError as err:  # Hydra's own writes before the task (.hydra/, the log file): a full disk, say
        run_dir.remove_what_this_run_created()
        exit_with(write_error(err, run_dir.path / ".hydra", "Hydra's record of the run (.hydra/ and runner.log)"))
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    _ = ret.return_value  # re-raises what the task raised that it did not handle itself: a bug, with its traceback


def search_path(args):
    """Where configs come from: Hydra's own, the runner's conf/ and -cd/--config-dir, as @hydra.main builds it."""
    import os

    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    path = create_automatic_config_search_path(None, "runner.commands.cli", args.config_path or CONFIG_DIR)
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise ConfigError("--config-dir", f"'{config_dir}' is not a folder")
        path.prepend(provider="command-line", path=f"file://{config_dir}", anchor=SearchPathQuery(provider="schema"))
    return path


def run_task(cfg: DictConfig, run_dir: rundir.RunDir | None = None) -> float:
    """One run, start to end. `run_dir`: what the entry point found before Hydra wrote into it (None for a sweep's
    job, whose numbered dir Hydra made just now)."""
    hydra = HydraConfig.get()
    multirun = hydra.mode == RunMode.MULTIRUN
    console_from_rank_zero_only()  # Hydra has just set up this job's logging, the console on every rank
    run_dir = run_dir or rundir.inspect(Path(hydra.runtime.output_dir))
    swap_recipe_groups(cfg, hydra)
    try:
        with stop_during_startup():
            if multirun:
                refuse_other_jobs_dir(run_dir.path, task_overrides(hydra))  # before anything reads its files
            spec = freeze(cfg, run_dir.path)
            if not run_dir.locked and writes_run_dir(spec.config.hardware.machine_rank):
                run_dir.lock()
            # Several machines decide "finished" together, from the checkpoint every rank loads (runner/launch/worker.py):
            # one machine alone skipping would leave the others waiting for it at the rendezvous.
            if spec.config.resume == "auto" and spec.config.hardware.num_machines == 1:
                done = finished_result(run_dir.path, task_overrides(hydra))
                missing = missing_final_artifacts(run_dir.path, spec.config) if done is not None else []
                if missing:  # the worker restores the last checkpoint and writes them (Loop.complete)
                    log.info("resume=auto: %s already finished but lacks %s; writing it now from its last checkpoint",
                             run_dir.path, ", ".join(missing))
                elif done is not None:
                    log.info("resume=auto: %s already finished with %s=%.4f; not running it again", run_dir.path,
                             done.monitor, done.value)
                    return done.value
            spec = preflight(spec)
            # Still inside: the worker installs its own start-up handler, and a stop signal in between (right after
            # preflight wrote config.yaml) would otherwise meet the default one and kill the process unreported.
            started = time.perf_counter()
            log.info("run dir: %s (follow it live: tensorboard --logdir %s)", run_dir.path, run_dir.path)
            final = launch(spec)
        value = monitored_value(final, spec.config.trainer.monitor)
    except RunnerError as err:
        err = with_recipe(with_sources(err, cfg), hydra.runtime.choices, task_overrides(hydra))
        err = with_group_origin(err, hydra)
        return _fail(err, run_dir, multirun)
    except Preempted as stop:
        run_dir.unlock()
        again = how_to_continue(stop, run_dir.path, hydra.sweep.dir if multirun else None)
        print(f"runner: {stop}{again}", file=sys.stderr)
        _to_log_files(f"{stop}{again}")  # the run's own record says why it ended, as a rank's log does
        hand_over_to_submitit(stop.signal_name)  # its time-limit signal: submitit requeues the job (and exits)
        raise SystemExit(PREEMPTED_EXIT_CODE)
    except KeyboardInterrupt:
        run_dir.unlock()
        print(f"runner: interrupted (Ctrl-C); {rundir_summary(run_dir)}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    run_dir.unlock()
    log.info("final %s | run dir %s", ", ".join(f"{k}={v:.4f}" for k, v in final.items()), run_dir.path)
    log.info("%s", end_summary(run_dir.path, spec.config, value, time.perf_counter() - started))
    return value


def end_summary(run_dir: Path, config: RunConfig, value: float, wall_s: float) -> str:
    """The monitored metric at the end and at its best (from metrics.jsonl), the wall time, and the exports."""
    from runner.sweep.report import read_metrics

    monitor, mode = config.trainer.monitor, config.trainer.monitor_mode.value
    _, best, best_step, _ = read_metrics(run_dir / "metrics.jsonl", monitor, mode)
    text = f"done in {wall_s:.1f} s: {monitor} final {value:.4f}"
    if best is not None:
        text += f", best {best:.4f} at step {best_step} ({mode})"
    exports = sorted(path.name for path in (run_dir / "export").glob("*")) if (run_dir / "export").is_dir() else []
    if exports:
        text += f"; exports in {run_dir / 'export'}: {', '.join(exports)}"
    return text


def how_to_continue(stop: Preempted, run_dir: Path, sweep_dir: str | None) -> str:
    """What follows a stop's message: nothing before training; how it continues from its checkpoint (submitit's
    requeue, the sweep re-run in its own dir, which -m needs, or resume=auto in the run dir); or that, with
    checkpoints off, the same command starts it over."""
    if not stop.step:
        return ""
    if not stop.checkpoint:  # checkpoint.enabled=false: there is nothing to continue from
        return "; the same command starts it over (with checkpoints on, a stop saves one to continue from)"
    if submitit_takes_over(stop.signal_name):
        return "; submitit requeues the job, which continues from it"
    if sweep_dir is not None:
        return f"; continue the sweep with the same command plus resume=auto hydra.sweep.dir={sweep_dir}"
    return f"; continue with the same command plus resume=auto hydra.run.dir={run_dir}"


def monitored_value(final: dict[str, float], monitor: str) -> float:
    if monitor not in final:
        raise ConfigError("trainer.monitor", f"'{monitor}' was not measured; the final metrics are {', '.join(final)}")
    return final[monitor]


def rundir_summary(run_dir: rundir.RunDir, resume_helps: bool = True, setting_first: bool = False) -> str:
    """What a run left behind when it stopped: its newest complete checkpoint, if any, and, when it would get
    past what stopped it (`resume_helps`), how to continue from it; after a bad setting (`setting_first`), once
    that is fixed (the same command would meet the same refusal, resume=auto or not)."""
    from runner.checkpoint import newest_complete_step

    step = newest_complete_step(run_dir.path / "checkpoints")
    if step is None:
        return f"no checkpoint was written; the run dir is {run_dir.path}"
    if not resume_helps:
        return f"the last complete checkpoint is step {step}, in {run_dir.path}"
    if setting_first:
        return (f"the last complete checkpoint is step {step}; with the setting above fixed, resume=auto "
                f"hydra.run.dir={run_dir.path} continues from it")
    return (f"the last complete checkpoint is step {step}; continue with the same command plus resume=auto "
            f"hydra.run.dir={run_dir.path}")


def _fail(err: RunnerError, run_dir: rundir.RunDir, multirun: bool) -> float:
    """Say what went wrong in one paragraph; remove what this invocation created if training never started."""
    started = run_dir.training_started
    message = (f"{err}; {rundir_summary(run_dir, err.resume_helps, isinstance(err, ConfigError))}"
               if started and err.names_run_dir_state else str(err))
    if multirun:  # a sweep keeps the job dir: its result.json records this error
        print_error(message)
        from runner.sweep.callback import SweepJobFailed

        run_dir.unlock()
        hydra = HydraConfig.get()
        # A job that submitit runs (hydra/launcher=slurm, slurm_local) prints into its own log files, not above the
        # line the launching process shows for it: that line then carries the error itself.
        where = (f"its error: {message}" if "submitit" in str(OmegaConf.select(hydra, "launcher._target_"))
                 else "its error is above")
        # The sweeper records this job as failed and runs the others.
        raise SweepJobFailed(f"job {hydra.job.num} failed ({where}; sweep_report.md lists every job)") from err
    if started:
        run_dir.unlock()
    else:
        run_dir.remove_what_this_run_created(keep=err.keep)
    exit_with(message)
