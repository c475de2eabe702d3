"""One process's run, top to bottom: join the group, seed, build, prepare, loop, close."""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

from runner.accelerate.accelerator import Accelerator
from runner.accelerate.options import DataLoaderConfiguration
from runner.config.instantiate import build_data
from runner.training.callbacks import end_artifacts
from runner.checkpoint import complete_checkpoints
from runner.training.checkpointer import EXPORT_DIR, FINAL_EXPORT, apply_rng, final_export_step, restore
from runner.checkpoint.resume import newest_intact
from runner.config import RunConfig, RunSpec, plain
from runner.training.debug import apply_determinism
from runner.distributed.dist import (
    DistInfo,
    broadcast_object,
    config_mismatch,
    destroy_process_group,
    detect_engine,
    engine_disagreement,
    exit_with_parent,
    external_rank,
    init_process_group,
    keep_process_group_until_exit,
    peer_store,
    restart_count,
    threads_per_process,
    whoami,
)
from runner.errors import (
    INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, ConfigError, LaunchError, Preempted, no_stray_tracebacks,
)
from runner.launch.failures import FAILURE_ATTRIBUTE, PeerLost, mark_step, worker_failure
from runner.training.loop import is_finished
from runner.accelerate.parallel import unused_parameters_hint
from runner.launch.peers import NoPeers, Peers
from runner.launch.shutdown import skip_collection_at_exit
from runner.distributed import signals
from runner.distributed.signals import stop_during_startup
from runner.run.wiring import Parts, build_parts, make_loop

log = logging.getLogger(__name__)

PEER_REPORT_WAIT_S = 2.0  # how long a rank that lost its peer waits for that peer's own report


def run(spec: RunSpec, keep_process_group: bool = False) -> dict[str, float]:
    """Entry point of every worker, in-process or started by a launcher. Returns final metrics."""
    dist = DistInfo.from_env()
    peers = NoPeers()
    library_warnings_to_the_log_file()
    try:
        with stop_during_startup():
            _join(spec, dist, keep_process_group)
            # After the group exists: under srun rank 0 hosts the store the peers meet at.
            peers = _peers(dist, spec.run_dir, spec.config.hardware.timeout_s)
            with peers:
                return _run(spec, dist, peers, keep_process_group)
    except Preempted:
        peers.leave("stopped")
        raise
    except Exception as err:
        if dist.is_distributed:  # finish the report even when the launcher starts stopping the group meanwhile
            signals.ignore(signal.SIGTERM)
        failure = worker_failure(dist.rank, err, peers, spec.config.hardware.timeout_s)
        if isinstance(failure, PeerLost):  # say why the peer went, once it has said so itself
            failure = peers.other_failure(wait_s=PEER_REPORT_WAIT_S) or failure
            setattr(err, FAILURE_ATTRIBUTE, failure)
        peers.report_failure(str(failure))
        raise


def _peers(dist: DistInfo, run_dir: str, timeout_s: float):
    store = peer_store(run_dir) if dist.is_distributed else None
    return Peers(store, dist.rank, dist.world_size, timeout_s) if store is not None else NoPeers()


def _join(spec: RunSpec, dist: DistInfo, keep_process_group: bool) -> None:
    """This process's share of the machine's cores, and its place in the process group."""
    import torch

    hardware = spec.hardware
    threads = threads_per_process(dist, hardware.threads_per_process)
    if threads is not None:  # a lone process nothing constrains keeps torch's default
        torch.set_num_threads(threads)
    engine = detect_engine()
    # Every rank says who it is; a lone process keeps the first examples' console to the run's own lines.
    log.log(logging.INFO if dist.is_distributed else logging.DEBUG, "%s", whoami(dist, engine))
    disagreement = engine_disagreement(dist, engine)
    if disagreement:
        raise LaunchError(disagreement)
    init_process_group(dist, hardware.backend, hardware.timeout_s)
    if keep_process_group:
        keep_process_group_until_exit()


def _run(spec: RunSpec, dist: DistInfo, peers, keep_process_group: bool) -> dict[str, float]:
    hardware, config = spec.hardware, spec.config
    mismatch = config_mismatch(plain(config)) if dist.is_distributed else None
    if mismatch:
        raise LaunchError(f"{mismatch}\n  every machine must run the same command (only machine_rank may differ)")
    # split_batches: the runner's batch plan splits trainer.batch_size (the global batch) among the processes, so
    # the schedule steps once per optimizer step (Accelerate's convention; see Accelerator._prepare_scheduler).
    accelerator = Accelerator(hardware=hardware, precision=config.precision.kind, dist=dist,
                              gradient_accumulation_steps=spec.batch.accumulation, parallel=config.parallel,
                              dataloader_config=DataLoaderConfiguration(split_batches=True), autocast_forward=False)
    final = train(spec, accelerator, peers)
    # Only after success: a failing rank keeps its connections until it exits, after it has reported its error, so
    # its peers (which fail when those connections drop) cannot be reported first and hide the root cause.
    if not keep_process_group:
        destroy_process_group()
    return final


def train(spec: RunSpec, accelerator: Accelerator, peers=None) -> dict[str, float]:
    """Build the parts, restore a checkpoint if the parent chose one, make the loop, fit."""
    config, run_dir = spec.config, Path(spec.run_dir)
    # Rank 0's choice on every rank: under torchrun each rank chose in its own parent, and only rank 0 fetched from
    # object storage (checkpoint.dir, resume=<URL>), so another rank may have looked before the download finished.
    resume_from = broadcast_object(_resume_point(spec))
    apply_determinism(config.trainer.deterministic)
    parts = build_parts(config, spec.batch, accelerator)
    restored = _restore(resume_from, parts, accelerator, config, spec.batch.global_batch) if resume_from else None
    # Ended by its step budget or stopped early by a callback (early stopping) at that checkpoint.
    budget_spent = bool(restored) and is_finished(restored["loop"]["step"], restored["loop"]["epoch"],
                                                  parts.total_steps, config.trainer.max_epochs)
    finished = bool(restored) and (restored["loop"].get("stop_reason") is not None or budget_spent)
    if finished and not _inside(resume_from, run_dir):
        # resume=<another run> continues it in this new run dir: past an early stop it trains on (the callback's
        # state came with the checkpoint, so a larger patience is what lets it go further); at the end of its step
        # budget there is nothing to train, and that run's own dir is where resume=auto completes its files.
        if budget_spent:
            raise ConfigError("trainer.max_steps", (
                f"is {config.trainer.max_steps} (max_epochs {config.trainer.max_epochs}), and {resume_from} is the end "
                f"of a finished run (step {restored['loop']['step']}, epoch {restored['loop']['epoch']}): a run "
                "continued from it in a new run dir trains further only with a larger trainer.max_steps or "
                "trainer.max_epochs (to write what that run's end lacks, use resume=auto in its own run dir)"))
        log.info("continuing %s, which stopped early (%s), in this new run dir: training goes on",
                 resume_from, restored["loop"]["stop_reason"])
        restored["loop"]["stop_reason"] = None
        finished = False
    # Rank 0's view of the shared run dir, so that every rank takes the same path.
    if finished and not broadcast_object(missing_final_artifacts(run_dir, config)):
        log.info("the run already finished at step %d (%s); nothing to do", restored["loop"]["step"], resume_from)
        return dict(restored["loop"]["last_metrics"])  # no loop built: not a file of the run dir is touched
    loop = make_loop(parts, config, spec.batch, accelerator, run_dir,
                     start_step=restored["loop"]["step"] if restored else 0)
    if peers is not None:
        peers.watch_progress(lambda: loop.state.step)
    if restored:
        loop.load_state_dict(restored["loop"], restored["this_rank"])
        loop.checkpointer.load_state_dict(restored["checkpointer"], source=Path(resume_from))
        apply_rng(restored)  # last: nothing after this draws random numbers before training continues
    else:
        loop.logger.log_config(plain(config))
    try:
        final = _complete(loop, run_dir, resume_from) if finished else loop.fit()
        loop.logger.log_final(plain(config), final)
    except Exception as err:
        mark_step(err, loop.state.step)
        hint = unused_parameters_hint(err)
        if hint:
            raise ConfigError("parallel.find_unused_parameters", hint) from err
        raise
    finally:
        loop.logger.close()
    return final


def _inside(path: str, run_dir: Path) -> bool:
    return Path(path).resolve().is_relative_to(run_dir.resolve())


def missing_final_artifacts(run_dir: Path, config: RunConfig) -> list[str]:
    """What a finished run should have written at its end and lacks (paths relative to the run dir): the final
    export of its newest checkpoint, the built-in callbacks' exports. `resume=auto` runs such a run again to write
    them (Loop.complete) instead of reporting it finished."""
    if config.trainer.fast_dev_run is not None:
        return []  # a debug run writes nothing
    missing = [path for path in end_artifacts(config.callbacks) if not (run_dir / path).is_file()]
    found = complete_checkpoints(run_dir / "checkpoints")
    exported = final_export_step(run_dir / EXPORT_DIR)
    # An export newer than every complete checkpoint is the run's end, whose checkpoint has lost its manifest since
    # (what a deletion stopped half-way leaves): the run's result is all there, and nothing is retrained for it.
    if config.checkpoint.enabled and config.checkpoint.export and found and (
            exported is None or exported < found[-1][1]["step"]):
        missing.insert(0, f"{EXPORT_DIR}/{FINAL_EXPORT}")
    return missing


def _complete(loop, run_dir: Path, resume_from: str) -> dict[str, float]:
    """A run restored from its last checkpoint that had already finished: write what its end did not, say which."""
    before = _export_files(run_dir)
    final = loop.complete()
    written = sorted(name for name, stamp in _export_files(run_dir).items() if before.get(name) != stamp)
    log.info("the run already finished at step %d (%s); %s", loop.state.step, resume_from,
             f"wrote what its end had not: {', '.join(written) or 'nothing'}")
    return final


def _export_files(run_dir: Path) -> dict[str, int]:
    export_dir = run_dir / EXPORT_DIR
    if not export_dir.is_dir():
        return {}
    return {f"{EXPORT_DIR}/{path.name}": path.stat().st_mtime_ns for path in export_dir.iterdir()
            if path.suffix == ".safetensors"}


def _resume_point(spec: RunSpec) -> str | None:
    """The checkpoint the parent chose; after the elastic agent restarted this group (hardware.max_restarts), the
    newest intact one in the run dir instead, so a restart continues where the failed attempt got to."""
    if restart_count() == 0:
        return spec.resume_from
    newest = newest_intact(Path(spec.run_dir) / "checkpoints", spec.config.checkpoint.verify)
    if newest is not None:
        log.info("restart %d: continuing from %s", restart_count(), newest)
    return str(newest) if newest is not None else spec.resume_from


def _restore(resume_from: str, parts: Parts, accelerator: Accelerator, config: RunConfig,
             global_batch: int) -> dict:
    """Load the checkpoint the parent chose into the built objects (RNG comes last, in `train`)."""
    restored = restore(Path(resume_from), parts.model, parts.optimizer, parts.scheduler, accelerator.scaler,
                       rank=accelerator.dist.rank, world_size=accelerator.num_processes,
                       global_batch=global_batch,
                       resolved=as_machine_0(plain(config)))
    position = restored["loop"]
    log.info("resumed from %s: step %d, epoch %d, batch %d of the epoch", resume_from, position["step"],
             position["epoch"], position["batch_in_epoch"])
    return restored


def as_machine_0(resolved: dict) -> dict:
    """The config as machine 0, which writes every checkpoint, resolved it: a machine-local key
    (hardware.machine_rank) differs between the machines of one run by design, so it must not count as a change
    when machine 1 compares its config with the checkpoint's (it warned "no longer an exact continuation")."""
    hardware = resolved.get("hardware")
    if not isinstance(hardware, dict) or hardware.get("machine_rank", 0) == 0:
        return resolved
    return {**resolved, "hardware": {**hardware, "machine_rank": 0}}


def run_spawned(spec: RunSpec) -> dict[str, float]:
    """Entry point for a process the elastic launcher started: its own log file, no orphan if the launcher dies,
    and a failure re-raised as one readable report (rank, step, end of the traceback) for the parent to print."""
    dist = DistInfo.from_env()
    exit_with_parent()
    no_stray_tracebacks()
    skip_collection_at_exit()
    log_to_rank_file(Path(spec.run_dir) / f"runner_rank{dist.rank}.log", console=dist.rank == 0)
    signals.interrupt_once()
    try:
        return run(spec)
    except Preempted as stop:
        log.info("%s", stop)
        raise SystemExit(PREEMPTED_EXIT_CODE)  # the launcher reports it; launch.py turns it back into Preempted
    except KeyboardInterrupt:
        log.info("rank %d interrupted (Ctrl-C)", dist.rank)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    except Exception as err:
        log.exception("rank %d failed", dist.rank)  # the whole traceback: into this rank's log file only
        # Written here, as torch's `record` around this function would write it on the way out, and ended with exit
        # status 1, which the agent reports the same way (it reads this file in both cases): an exception leaving
        # this function would also make torch.multiprocessing pickle a traceback into a file of its own in /tmp,
        # which nothing reads here and nothing removes (pytorch/pytorch#169258).
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(worker_failure(dist.rank, err))
        raise SystemExit(1) from None


class _NoTraceback(logging.Formatter):
    """The console gets one line per record: tracebacks go to the rank's log file."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text = saved


class _NotFromLibraries(logging.Filter):
    """Drops, on the console, a Python warning raised inside an installed library or the standard library (FSDP's
    "returned a view tensor", torchao's start-up notes): it is in the run's log file, and the console keeps the
    run's own lines and the warnings of the user's code."""

    def __init__(self):
        super().__init__()
        import sysconfig

        self._library_roots = tuple({sysconfig.get_path(name) for name in ("purelib", "platlib", "stdlib")})
        # The runner's own warnings are for the user, wherever it is installed.
        self._runner_root = str(Path(__file__).resolve().parents[1])

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "py.warnings":
            return True
        where = str(record.args[0] if record.args else record.msg).split(":", 1)[0]
        return where.startswith(self._runner_root) or not where.startswith(self._library_roots)


def library_warnings_to_the_log_file() -> None:
    """Python warnings become log records (logging.captureWarnings), so they reach this process's log file; the
    console handlers then leave out those a library raised (`_NotFromLibraries`)."""
    logging.captureWarnings(True)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) and not any(
                isinstance(existing, _NotFromLibraries) for existing in handler.filters):
            handler.addFilter(_NotFromLibraries())


def console_from_rank_zero_only() -> None:
    """Under torchrun or srun every rank is a `python -m runner` whose Hydra logging writes to the console as well
    as to its own runner_rank<N>.log: only rank 0 keeps the console, as under the runner's own launcher
    (`log_to_rank_file`), so a run's lines are not printed once per rank."""
    if external_rank() in (None, 0):
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)


def log_to_rank_file(path: Path, console: bool) -> None:
    """This rank's log lines go to its own file and, on rank 0 only (`console`), without tracebacks to the
    console: the other ranks' lines would repeat rank 0's. A rank that fails is reported by the parent anyway
    (runner/launch/failures.py). A forked worker inherited the parent's handlers (its runner.log among them): they are
    dropped, not closed, since the parent still writes through them."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    layout = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter(layout))
    root.addHandler(to_file)
    if console:
        to_console = logging.StreamHandler(sys.stdout)
        to_console.setFormatter(_NoTraceback(layout))
        root.addHandler(to_console)
    root.setLevel(logging.INFO)


def prepare_data(config: RunConfig) -> float:
    """Build the datasets once in the launching process, so generation, `map` and caching happen once and the
    workers read the datasets cache instead of all doing it at the same moment. Returns the seconds it took."""
    started = time.perf_counter()
    build_data(config.data)
    return time.perf_counter() - started
