"""`python -m runner`: the Hydra entry point. Compose, check, freeze, make the run dir, launch, report.

A plain run composes the config once and runs it through Hydra's own `run_job` (the `@hydra.main` path composes
twice: once only to learn the mode). Everything else Hydra offers on the command line (`-m`, `--cfg`, `--info`,
`--help`, `--shell-completion`, a config that sets `hydra.mode=MULTIRUN`) goes through Hydra's standard entry
unchanged, with the same task function.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from runner import rundir
from runner.checks import check
from runner.checkpoint import find_resume, refuse_another_world_size
from runner.config import RunConfig, RunSpec, plain
from runner.config.groups import drop_swapped_group_keys, group_default_origin
from runner.distributed.devices import resolve_hardware
from runner.distributed.dist import adopt_slurm_tasks, restart_count, writes_run_dir
from runner.errors import (
    INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, ConfigError, Preempted, Problem, RunnerError, no_stray_tracebacks,
    write_failure,
)
from runner.launch import launch
from runner.worker import missing_final_artifacts
from runner.training.batch_plan import batch_plan
from runner.config.search_path import config_dir
from runner.report import finished_result
from runner.resolvers import register_configs
from runner.shutdown import skip_collection_at_exit
from runner.sweep import refuse_search_under_torchrun
from runner.distributed.signals import stop_during_startup

log = logging.getLogger("runner")

register_configs()

# An absolute path: `python -m runner` works from any working directory, from a checkout or an installed wheel.
CONFIG_DIR = str(config_dir())
CONFIG_NAME = "config"
# Flags that ask Hydra for something other than running: its standard entry handles them.
NOT_A_RUN = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun")
# Targets a Hydra callback may name besides allowed_targets: Hydra's own callbacks.
CALLBACK_PREFIXES = ("runner.sweep.", "hydra.experimental.callbacks.")


# `runner WORD ...`: the runner's other commands (each also `python -m runner.WORD ...`). A word without `=` is
# never a Hydra override, so these cannot clash with one.
COMMANDS = {"launch": "runner.launch", "machine": "runner.machine", "plan": "runner.plan", "recipes": "runner.recipes",
            "sample": "runner.sample", "env": "runner.env"}


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
    if arguments and arguments[0] in COMMANDS:
        import importlib

        code = importlib.import_module(COMMANDS[arguments[0]]).main(arguments[1:])
        if code:
            raise SystemExit(code)
        return
    no_stray_tracebacks()
    skip_collection_at_exit()
    adopt_slurm_tasks()  # srun's tasks become the ranks before anything reads RANK (the run dir, the lock)
    parser = get_args_parser()
    args = parser.parse_intermixed_args(arguments)  # `k=v -cd DIR k=v` as well as options first
    if any(getattr(args, flag, None) for flag in NOT_A_RUN):
        return _hydra_entry(args, parser)
    _run(args, parser)


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

    config_name = args.config_name or CONFIG_NAME
    mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
    try:
        try:
            hydra = Hydra.create_main_hydra2(task_name="runner", config_search_path=search_path(args))
            cfg = hydra.compose_config(config_name, args.overrides, run_mode=mode, with_log_configuration=True,
                                       validate_sweep_overrides=mode is RunMode.RUN)
        except Exception as err:  # Hydra's and OmegaConf's composition errors: the message says it all
            _exit_with(composition_error(err, args.overrides))
        problems = callback_problems(cfg)
        if problems:
            _exit_with(ConfigError(problems))
        if args.multirun or cfg.hydra.mode == RunMode.MULTIRUN:  # -m, or e.g. hparams_search=...: a sweep
            # Here, from the one composition, not in a sweep callback: Hydra composes twice more before its
            # callbacks run, seconds in which torchrun may already be ending this rank for its peer's refusal.
            refuse_search_under_torchrun(cfg)
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
        _exit_with(err if isinstance(err, RunnerError) else composition_error(err, []))
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                  task_function=lambda task_cfg: run_task(task_cfg, run_dir), config=cfg,
                  job_dir_key="hydra.run.dir", job_subdir_key=None)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    _ = ret.return_value  # re-raises what the task raised that it did not handle itself: a bug, with its traceback


def search_path(args):
    """Where configs come from: Hydra's own, the runner's conf/ and -cd/--config-dir, as @hydra.main builds it."""
    import os

    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    path = create_automatic_config_search_path(None, "runner.cli", args.config_path or CONFIG_DIR)
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise ConfigError("--config-dir", f"'{config_dir}' is not a folder")
        path.prepend(provider="command-line", path=f"file://{config_dir}", anchor=SearchPathQuery(provider="schema"))
    return path


def composition_error(err: BaseException, overrides: list[str]) -> str:
    """Hydra's message, plus the OmegaConf error behind it (which names the full key), on one screen; for an
    override that does not parse, which one it is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    text = str(err).strip()
    missing = re.match(r"In '[^']*': Could not load '([\w/]+)/(\w+)'", text)
    if missing:  # an unknown name in a list group (logger=[tensorboard,tensorbord]): Hydra lists no options there
        group, name = missing.groups()
        options = sorted(path.stem for path in (Path(CONFIG_DIR) / group).glob("*.yaml"))
        if options:
            return f"{group}: '{name}' is not one of its options; the valid names are {', '.join(options)}"
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip() not in text:
        text += "\n" + str(cause).strip()
    if isinstance(err, OverrideParseException):
        for override in overrides:
            try:
                OverridesParser.create().parse_overrides([override])
            except OverrideParseException:
                return f"the command-line override {override!r} does not parse: {text}"
    return text


def callback_problems(cfg: DictConfig) -> list:
    """hydra.callbacks are built by Hydra before any run starts: their targets pass the same checks as the
    recipe's."""
    from runner.config.instantiate import target_problems

    callbacks = OmegaConf.to_container(cfg.hydra.callbacks, resolve=False) or {}
    allowed = [*OmegaConf.select(cfg, "allowed_targets", default=[]), *CALLBACK_PREFIXES]
    return target_problems({f"hydra.callbacks.{name}": node for name, node in callbacks.items()}, allowed)


def run_task(cfg: DictConfig, run_dir: rundir.RunDir | None = None) -> float:
    """One run, start to end. `run_dir`: what the entry point found before Hydra wrote into it (None for a sweep's
    job, whose numbered dir Hydra made just now)."""
    hydra = HydraConfig.get()
    multirun = hydra.mode == RunMode.MULTIRUN
    run_dir = run_dir or rundir.inspect(Path(hydra.runtime.output_dir))
    swap_recipe_groups(cfg, hydra)
    try:
        with stop_during_startup():
            spec = freeze(cfg, run_dir.path)
            if not run_dir.locked and writes_run_dir(spec.config.hardware.machine_rank):
                run_dir.lock()
            # Several machines decide "finished" together, from the checkpoint every rank loads (runner/worker.py):
            # one machine alone skipping would leave the others waiting for it at the rendezvous.
            if spec.config.resume == "auto" and spec.config.hardware.num_machines == 1:
                done = finished_result(run_dir.path, _task_overrides(hydra))
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
        err = with_recipe(with_sources(err, cfg), hydra.runtime.choices, _task_overrides(hydra))
        err = with_group_origin(err, hydra)
        return _fail(err, run_dir, multirun)
    except Preempted as stop:
        run_dir.unlock()
        again = f"; continue with the same command plus resume=auto hydra.run.dir={run_dir.path}" if stop.step else ""
        print(f"runner: {stop}{again}", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT_CODE)
    except KeyboardInterrupt:
        run_dir.unlock()
        print(f"runner: interrupted (Ctrl-C); {rundir_summary(run_dir)}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    run_dir.unlock()
    log.info("final %s | run dir %s", ", ".join(f"{k}={v:.4f}" for k, v in final.items()), run_dir.path)
    log.info("%s", end_summary(run_dir.path, spec.config, value, time.perf_counter() - started))
    return value


def swap_recipe_groups(cfg: DictConfig, hydra) -> list:
    """A group chosen on the command line (scheduler=none) replaces the recipe's choice together with the keys the
    recipe set for it: drop them, and say which."""
    sources = [str(source.path) for source in hydra.runtime.config_sources if source.schema == "file"]
    swaps = drop_swapped_group_keys(cfg, dict(hydra.runtime.choices), _task_overrides(hydra), sources,
                                    hydra.job.config_name or CONFIG_NAME)
    for swap in swaps:
        log.info("%s", swap.describe(hydra.runtime.choices.get("recipe")))
    return swaps


def end_summary(run_dir: Path, config: RunConfig, value: float, wall_s: float) -> str:
    """The monitored metric at the end and at its best (from metrics.jsonl), the wall time, and the exports."""
    from runner.report import read_metrics

    monitor, mode = config.trainer.monitor, config.trainer.monitor_mode.value
    _, best, best_step, _ = read_metrics(run_dir / "metrics.jsonl", monitor, mode)
    text = f"done in {wall_s:.1f} s: {monitor} final {value:.4f}"
    if best is not None:
        text += f", best {best:.4f} at step {best_step} ({mode})"
    exports = sorted(path.name for path in (run_dir / "export").glob("*")) if (run_dir / "export").is_dir() else []
    if exports:
        text += f"; exports in {run_dir / 'export'}: {', '.join(exports)}"
    return text


def _task_overrides(hydra) -> list[str]:
    """The command line's overrides as typed (an override like `lr=${x}` stays text, never resolved)."""
    return [str(item) for item in OmegaConf.to_container(hydra.overrides.task, resolve=False)]


def preflight(spec: RunSpec) -> RunSpec:
    """Everything decided once, in this process, before a worker starts: the hardware (processes, GPUs), the batch
    plan, every cross-field check, the checkpoint to resume from, and config.yaml."""
    config = spec.config
    hardware = resolve_hardware(config.hardware, config.gpu_ids)
    hardware.apply()  # CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises: before any check touches CUDA
    check(config, hardware)
    if hardware.physical_gpus:
        log.info("%s", hardware.gpu_table())
    # config.yaml records the process count the run used (a null num_processes resolved here).
    config = replace(config, hardware=replace(config.hardware, num_processes=hardware.processes_per_machine))
    run_dir = Path(spec.run_dir)
    # A restarted group (torchrun --max-restarts) continues from its newest checkpoint on its own.
    resume = config.resume or ("auto" if restart_count() > 0 else None)
    resume_from = find_resume(resume, run_dir, config.checkpoint.verify)
    if resume_from is not None:
        refuse_another_world_size(resume_from, hardware.world_size)
    # One writer, also when machines share the run dir; a debug run (fast_dev_run) writes nothing but its log.
    if writes_run_dir(config.hardware.machine_rank) and config.trainer.fast_dev_run is None:
        _write_config(run_dir, plain(config), resume_from)
    return replace(spec, config=config, hardware=hardware, batch=batch_plan(config.trainer, hardware.world_size),
                   resume_from=str(resume_from) if resume_from else None)


def load(overrides: list[str]) -> RunSpec:
    """A config composed, frozen and resolved for this machine (hardware and batch plan), without running it or
    writing anything: for the tools (runner.validate's command line, the plan). Raises the run's own errors."""
    return resolve(compose_config(overrides))


def compose_config(overrides: list[str]) -> DictConfig:
    """The composed config as Hydra gives it (no `hydra` node), nothing resolved or checked yet."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError("config", composition_error(err, list(overrides))) from None
    return apply_group_swaps(cfg)


def apply_group_swaps(cfg: DictConfig) -> DictConfig:
    """A config composed with its `hydra` node (return_hydra_config=True) as a run gets it: the recipe's keys for a
    group swapped on the command line dropped, the `hydra` node removed."""
    swap_recipe_groups(cfg, cfg.hydra)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def resolve(cfg: DictConfig) -> RunSpec:
    """load()'s second half: frozen, checked, and resolved for this machine."""
    spec = freeze(cfg, Path.cwd())
    hardware = resolve_hardware(spec.config.hardware, spec.config.gpu_ids)
    check(spec.config, hardware)
    return replace(spec, hardware=hardware, batch=batch_plan(spec.config.trainer, hardware.world_size))


def freeze(cfg: DictConfig, run_dir: Path) -> RunSpec:
    """Resolve every interpolation once, here, and hand workers plain typed objects (never a DictConfig)."""
    try:
        config = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(err.full_key, "is required and has no value; set it on the command line, "
                                        f"e.g. {err.full_key}=...") from None
    except OmegaConfBaseException as err:
        message = str(err).split("\n")[0]
        raise ConfigError(getattr(err, "full_key", None) or "config", message) from None
    assert isinstance(config, RunConfig)
    return RunSpec(config=config, run_dir=str(run_dir))


def _write_config(run_dir: Path, resolved: dict, resume_from: Path | None) -> None:
    """config.yaml records how the run was started; a run continued in place keeps its original one."""
    if (run_dir / "config.yaml").is_file():
        log.info("continuing the run in %s from %s; its config.yaml is kept", run_dir, resume_from or "scratch")
        return
    with write_failure(run_dir / "config.yaml", "the run's config.yaml"):
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    if resume_from:
        log.info("this run starts from the checkpoint %s", resume_from)


def with_sources(err: RunnerError, cfg: DictConfig) -> RunnerError:
    """A bad value that came through an interpolation (model.max_len: ${data.seq_len}) is named with the key the
    user set, so the message points at what to change."""
    if not isinstance(err, ConfigError):
        return err
    sources = interpolation_sources(OmegaConf.to_container(cfg, resolve=False))
    problems = [replace(problem, key=f"{problem.key} (from {sources[problem.key]})")
                if problem.key in sources and not problem.message.startswith("is not an argument") else problem
                for problem in err.problems]
    return ConfigError(problems) if problems != err.problems else err


# Groups that build a target: a recipe written for one option of them may not fit another.
TARGET_GROUPS = ("model", "optimizer", "scheduler", "data", "task", "tokenizer")


def with_recipe(err: RunnerError, choices, overrides: list[str]) -> RunnerError:
    """A recipe's group swapped on the command line (recipe=reverse model=mlp) that does not fit what the recipe
    sets: say so, naming the recipe and the pair, after the problem itself."""
    swapped = [item for item in overrides if item.split("=", 1)[0].lstrip("+~") in TARGET_GROUPS and "=" in item]
    if not isinstance(err, ConfigError) or not swapped or not any(
            problem.key.split(".")[0].split("[")[0] in (*TARGET_GROUPS, "trainer") for problem in err.problems):
        return err
    recipe, pairs = choices.get("recipe"), " ".join(swapped)
    note = Problem("recipe", f"{recipe} is written for its own groups, and {pairs} (from the command line) does not fit "
                             f"what it sets: recipe={recipe} and {pairs} do not go together; use a recipe written for "
                             f"{pairs} (`python -m runner --info defaults` lists the choices) or set the keys above")
    return ConfigError([*err.problems, note])


def with_group_origin(err: RunnerError, hydra) -> RunnerError:
    """`model.vocab_size: is not an argument of mylab.Wide`: when the key came from the model group's default
    option (the recipe replaced its _target_ but kept the group), say so and give the one-line fix."""
    if not isinstance(err, ConfigError):
        return err
    sources = [str(source.path) for source in hydra.runtime.config_sources if source.schema == "file"]
    choices, recipe = dict(hydra.runtime.choices), hydra.runtime.choices.get("recipe")
    problems = []
    for problem in err.problems:
        found = re.match(r"is not an argument of ([\w.]+)", problem.message)
        origin = found and group_default_origin(problem.key, found.group(1), choices, sources)
        if origin:
            group = problem.key.split(".")[0]
            problem = replace(problem, message=(
                f"{problem.message}. {problem.key} comes from {origin}, the {group} group's option "
                f"{choices.get(group)} (the default unless the recipe overrides it), whose keys stay under your "
                f"{group} when the recipe only sets {group}._target_: add `- override /{group}: null` to the "
                f"defaults list of recipe {recipe} (or add ~{group} to the command line), so the {group} node holds "
                "only what the recipe sets"))
        problems.append(problem)
    return ConfigError(problems) if problems != err.problems else err


def interpolation_sources(node, prefix: str = "") -> dict[str, str]:
    """{key: the key it copies} for every value that is exactly one `${other.key}` interpolation."""
    found = {}
    if isinstance(node, dict):
        for name, value in node.items():
            found.update(interpolation_sources(value, f"{prefix}{name}."))
    elif isinstance(node, str) and node.startswith("${") and node.endswith("}") and node.count("${") == 1 \
            and ":" not in node:
        found[prefix.rstrip(".")] = node[2:-1]
    return found


def monitored_value(final: dict[str, float], monitor: str) -> float:
    if monitor not in final:
        raise ConfigError("trainer.monitor", f"'{monitor}' was not measured; the final metrics are {', '.join(final)}")
    return final[monitor]


def rundir_summary(run_dir: rundir.RunDir, resume_helps: bool = True) -> str:
    """What a run left behind when it stopped: its newest complete checkpoint, if any, and, when it would get
    past what stopped it (`resume_helps`), how to continue from it."""
    from runner.checkpoint import newest_complete_step

    step = newest_complete_step(run_dir.path / "checkpoints")
    if step is None:
        return f"no checkpoint was written; the run dir is {run_dir.path}"
    if not resume_helps:
        return f"the last complete checkpoint is step {step}, in {run_dir.path}"
    return (f"the last complete checkpoint is step {step}; continue with the same command plus resume=auto "
            f"hydra.run.dir={run_dir.path}")


def _fail(err: RunnerError, run_dir: rundir.RunDir, multirun: bool) -> float:
    """Say what went wrong in one paragraph; remove what this invocation created if training never started."""
    started = run_dir.training_started
    kept = f"; {rundir_summary(run_dir, err.resume_helps)}" if started else ""
    print(f"runner: error: {err}{kept}", file=sys.stderr)
    if multirun:  # a sweep keeps the job dir: its result.json records this error
        from runner.sweep import SweepJobFailed

        run_dir.unlock()
        job = HydraConfig.get().job.num
        # The sweeper records this job as failed and runs the others.
        raise SweepJobFailed(f"job {job} failed (its error is above; sweep_report.md lists every job)") from err
    if started:
        run_dir.unlock()
    else:
        run_dir.remove_what_this_run_created(keep=err.keep)
    raise SystemExit(1)


def _exit_with(err: BaseException | str) -> None:
    print(f"runner: error: {err}", file=sys.stderr)
    raise SystemExit(1)
