"""Run the workers: in this process for one, through torch's elastic launcher (torchrun's engine) for several.

    one process                 -> worker.run(spec), here
    started by torchrun / SLURM -> worker.run(spec) in every rank, no respawn (RANK etc. already set)
    several processes/machines  -> elastic_launch(N workers per machine) -> worker.run_spawned(spec) in each

The parent has already composed, checked and resolved the config; workers get it frozen, as an argument.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from runner import worker
from runner.config import RunSpec
from runner.dist import DistInfo, threads_per_process
from runner.errors import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, LaunchError, Preempted
from runner.failures import root_cause
from runner.signals import stop_during_startup

log = logging.getLogger(__name__)

RANK_OUTPUT_DIR = "ranks"  # the launcher's raw stdout/stderr of every rank, under the run dir


def launch(spec: RunSpec) -> dict[str, float]:
    hardware = spec.hardware
    if hardware.external_launcher:
        return worker.run(spec, keep_process_group=True)
    if hardware.launches_processes:
        return elastic_launch(spec)
    return worker.run(spec)


def launch_config(spec: RunSpec):
    """The elastic launcher's settings for this run: one machine on a free local port, or `num_machines` meeting
    at machine 0's static rendezvous (machine m holds global ranks m*N .. m*N+N-1, like torchrun --node-rank)."""
    from torch.distributed.elastic.multiprocessing import Std
    from torch.distributed.launcher.api import LaunchConfig

    hardware = spec.hardware
    if hardware.num_machines == 1:
        # Port 0: the rendezvous picks a free port, so two runs at once never collide.
        rendezvous = dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=f"runner-{uuid.uuid4().hex[:8]}",
                          rdzv_configs={"timeout": hardware.timeout_s})
    else:
        rendezvous = dict(rdzv_backend="static", rdzv_endpoint=f"{hardware.main_process_ip}:{hardware.main_process_port}",
                          run_id="runner", rdzv_configs={"rank": hardware.machine_rank, "timeout": hardware.timeout_s})
    return LaunchConfig(
        min_nodes=hardware.num_machines,
        max_nodes=hardware.num_machines,
        nproc_per_node=hardware.processes_per_machine,
        max_restarts=0,
        start_method=hardware.start_method.value,
        shutdown_timeout=hardware.shutdown_timeout_s,
        logs_specs=rank_logs(Path(spec.run_dir) / RANK_OUTPUT_DIR, redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template="[rank${rank}]:",
        **rendezvous,
    )


def rank_logs(log_dir: Path, **kwargs):
    """Each rank's raw stdout/stderr under the run dir, as torch's DefaultLogsSpecs lays them out; the small error
    files the launcher reads a failing rank's report from go to a temporary folder instead, so a full disk under
    the run dir cannot truncate them (the launcher would then fail on its own JSON)."""
    import tempfile

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    class RankLogs(DefaultLogsSpecs):
        def reify(self, envs):
            logs = super().reify(envs)
            errors = Path(tempfile.mkdtemp(prefix="runner-errors-"))
            for rank in logs.error_files:
                logs.error_files[rank] = envs[rank]["TORCHELASTIC_ERROR_FILE"] = str(errors / f"error_{rank}.json")
            return logs

    return RankLogs(log_dir=str(log_dir), **kwargs)


@contextmanager
def omp_threads_for_workers(threads: int) -> Iterator[None]:
    """OMP_NUM_THREADS for the workers started inside this block, unless the user set it (torchrun does the same).
    OpenMP reads it once, when torch loads, so a spawned worker needs it in its environment from the start; each
    worker also calls torch.set_num_threads. A forked worker inherits this process's OpenMP state instead."""
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        del os.environ["OMP_NUM_THREADS"]


def leave_loky_start_method() -> None:
    """Inside a joblib launcher's (loky) worker the default start method is "loky", from which torch cannot start
    processes (`cannot find context for 'loky'`, pytorch #44687): fall back to spawn there."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) == "loky":
        multiprocessing.set_start_method("spawn", force=True)


def elastic_launch(spec: RunSpec) -> dict[str, float]:
    """Start this machine's workers and wait for them; the final metrics of its lowest rank (rank 0 on machine 0;
    every rank holds the same, gathered across all processes).

    torch's agent runs in a thread of this process, so that the signals stay with this process's main thread:
    a stop signal is passed on to the workers and this process waits for their own answer (exit 75 once their
    checkpoint is sealed) instead of killing them after a fixed grace, and Ctrl-C ends the workers within seconds."""
    from torch.distributed.launcher.api import elastic_launch as torch_elastic_launch

    hardware = spec.hardware
    num_processes = hardware.processes_per_machine
    leave_loky_start_method()
    with stop_during_startup():
        worker.prepare_data(spec.config)  # generate and cache once, here, before the ranks read it
    log.info(
        "launching %d worker process(es) on machine %d of %d (%s start) from pid %d; their logs: %s",
        num_processes, hardware.machine_rank, hardware.num_machines, hardware.start_method.value, os.getpid(),
        Path(spec.run_dir) / "runner_rank<N>.log",
    )
    outcome: dict = {}
    # An Event, not Thread.join: a join interrupted by Ctrl-C can leave the thread looking finished (CPython).
    agent_done = threading.Event()

    def agent() -> None:
        try:
            outcome["results"] = torch_elastic_launch(launch_config(spec), worker.run_spawned)(spec)
        except BaseException as err:  # handed to the main thread, which reports it
            outcome["error"] = err
        finally:
            agent_done.set()

    agent_thread = threading.Thread(target=agent, name="runner-agent", daemon=True)
    stop_signals = [signal.Signals[str(getattr(name, "value", name))] for name in spec.config.checkpoint.stop_signals]
    with omp_threads_for_workers(threads_per_process(DistInfo(local_world_size=num_processes),
                                                     hardware.threads_per_process)), \
            quiet_torch_launcher_logs(), forward_to_workers(stop_signals) as forwarded:
        agent_thread.start()
        try:
            while not agent_done.wait(0.2):
                pass
        except KeyboardInterrupt:
            end_workers(signal.SIGINT, grace_s=INTERRUPT_GRACE_S)
            agent_done.wait(INTERRUPT_GRACE_S + 10)  # the agent notices and shuts its store down before we exit
            raise
    return launch_outcome(spec, outcome, forwarded)


INTERRUPT_GRACE_S = 3.0  # after Ctrl-C, how long the workers get to exit before they are killed


def launch_outcome(spec: RunSpec, outcome: dict, forwarded: list[signal.Signals]) -> dict[str, float]:
    """The workers' results, or what their exit codes say: all 75 (they stopped and sealed their checkpoint),
    all 130 (Ctrl-C), or the root cause of a failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from runner.checkpoint import newest_complete_step
    from runner.checkpoint.files import checkpoint_name

    if "results" in outcome:
        results = outcome["results"]
        return results[min(results)]
    err = outcome.get("error")
    checkpoints = Path(spec.run_dir) / "checkpoints"
    if isinstance(err, ChildFailedError):
        codes = {failure.exitcode for failure in err.failures.values()}
        if codes == {PREEMPTED_EXIT_CODE}:
            step = newest_complete_step(checkpoints)
            saved = checkpoints / checkpoint_name(step) if step is not None and spec.config.checkpoint.enabled else None
            name = forwarded[0].name if forwarded else "a stop signal"
            raise Preempted(name, step, saved) from None
        if codes == {INTERRUPTED_EXIT_CODE}:
            raise KeyboardInterrupt
        rank, message = root_cause(err.failures)
        raise LaunchError(f"{message}\n  its full log: {Path(spec.run_dir) / f'runner_rank{rank}.log'}") from None
    # The rendezvous itself failed (a machine never came, a port was taken).
    raise LaunchError(f"the workers could not start: {type(err).__name__}: {err}") from None


@contextmanager
def forward_to_workers(stop_signals: list[signal.Signals]) -> Iterator[list[signal.Signals]]:
    """While the workers run, a stop signal sent to this process (a scheduler's, `kill`) goes on to them; the
    list it yields records which arrived."""
    received: list[signal.Signals] = []

    def forward(signum, frame) -> None:
        received.append(signal.Signals(signum))
        for pid in child_pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in stop_signals}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_workers(sig: signal.Signals, grace_s: float) -> None:
    """Send `sig` to the workers, give them `grace_s` to exit, then kill what is left."""
    pids = child_pids()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def child_pids() -> list[int]:
    """This process's children (the workers the agent thread started), from /proc; [] where there is none."""
    pids = []
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in children.read_text().split()]
        except OSError:
            pass
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@contextmanager
def quiet_torch_launcher_logs() -> Iterator[None]:
    """torch's launcher logs each failing worker's whole traceback to the console; the runner prints one report
    instead, and each rank's full traceback stays in its own log file."""
    import torch.distributed.elastic.multiprocessing.api  # noqa: F401  (its loggers exist from here on)

    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict) if name.startswith(prefixes)]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled
