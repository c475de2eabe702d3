"""torch's elastic agent (the engine behind torchrun), run from a thread of this process for N local workers.

Shared by the runner's own workers (runner/launch/launcher.py `elastic_launch`) and a user's script (`python -m
runner.launch`). The agent runs in a thread so that the signals stay with this process's main thread: a stop
signal is passed on to the workers and this process waits for their own answer (the runner's exit 75 once their
checkpoint is sealed) instead of killing them after a fixed grace, and Ctrl-C ends every worker within seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from runner.distributed.devices import Hardware
from runner.distributed.dist import RUNNER_RUN_ID, DistInfo, threads_per_process
from runner.distributed.signals import handling, stop_before_training

log = logging.getLogger(__name__)

INTERRUPT_GRACE_S = 3.0  # after Ctrl-C, how long the workers get to exit before they are killed


@dataclass
class Outcome:
    """What the agent thread ended with: the workers' return values ({rank: value}) or the error it raised, and
    the stop signals this process passed on meanwhile."""

    results: dict | None = None
    error: BaseException | None = None
    forwarded: list[signal.Signals] = field(default_factory=list)
    exited: dict[int, float] = field(default_factory=dict)
    """{pid: time.monotonic() when it exited} of the workers, to the millisecond: which rank failed first (the
    launcher's own failure timestamps have one-second resolution, and it ends the other ranks within that second)."""


def launch_config(hardware: Hardware, log_dir: Path, errors_dir: Path, rank0_console: bool = False):
    """The agent's settings: one machine on a free local port, or `num_machines` meeting at machine 0's static
    rendezvous (machine m holds global ranks m*N .. m*N+N-1, like torchrun --node-rank). The ranks' error files go
    under `errors_dir` (rank_logs).

    `rank0_console` (the runner's own workers): local rank 0 writes straight to this terminal, so its progress bar
    redraws in place (through the agent's tee every redraw would become a new line), and the other ranks' output
    goes only to their files under `log_dir` (their log lines are in runner_rank<N>.log). Otherwise (a user's
    script) every rank's output is teed to the console with a [rank<N>]: prefix."""
    from torch.distributed.elastic.multiprocessing import Std
    from torch.distributed.launcher.api import LaunchConfig

    if hardware.num_machines == 1:
        # Port 0: the rendezvous picks a free port, so two runs at once never collide.
        rendezvous = dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          run_id=f"{RUNNER_RUN_ID}-{uuid.uuid4().hex[:8]}", rdzv_configs={"timeout": hardware.timeout_s})
    else:
        rendezvous = dict(rdzv_backend="static", rdzv_endpoint=f"{hardware.main_process_ip}:{hardware.main_process_port}",
                          run_id=RUNNER_RUN_ID, rdzv_configs={"rank": hardware.machine_rank, "timeout": hardware.timeout_s})
    return LaunchConfig(
        min_nodes=hardware.num_machines,
        max_nodes=hardware.num_machines,
        nproc_per_node=hardware.processes_per_machine,
        max_restarts=hardware.max_restarts,
        start_method=hardware.start_method.value,
        shutdown_timeout=hardware.shutdown_timeout_s,
        logs_specs=(rank_logs(log_dir, errors_dir, announce_restart(log_dir.parent),
                              redirects={rank: Std.NONE if rank == 0 else Std.ALL
                                         for rank in range(hardware.processes_per_machine)}, tee=Std.NONE)
                    if rank0_console else rank_logs(log_dir, errors_dir, redirects=Std.ALL, tee=Std.ALL)),
        log_line_prefix_template="[rank${rank}]:",
        **rendezvous,
    )


def rank_logs(log_dir: Path, errors_dir: Path, on_restart=None, **kwargs):
    """Each rank's raw stdout/stderr under `log_dir`, as torch's DefaultLogsSpecs lays them out; the small error
    files the agent reads a failing rank's report from go to `errors_dir` (a temporary folder, one subfolder per
    attempt) instead, so a full disk under the run dir cannot truncate them (the agent would then fail on its own
    JSON). The agent lays out each attempt anew: on a restart, `on_restart(restart, max_restarts, {global rank:
    (report, written)})` gets the failed attempt's reports."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    class RankLogs(DefaultLogsSpecs):
        previous: dict[int, Path] = {}  # global rank -> error file of the attempt before

        def reify(self, envs):
            logs = super().reify(envs)
            any_env = next(iter(envs.values()))
            restart = int(any_env.get("TORCHELASTIC_RESTART_COUNT", "0"))
            if restart > 0 and on_restart is not None:
                on_restart(restart, int(any_env.get("TORCHELASTIC_MAX_RESTARTS", "0")), _reports(self.previous))
            errors = errors_dir / f"attempt_{restart}"
            errors.mkdir(parents=True, exist_ok=True)
            self.previous = {}
            for rank in logs.error_files:
                logs.error_files[rank] = envs[rank]["TORCHELASTIC_ERROR_FILE"] = str(errors / f"error_{rank}.json")
                self.previous[int(envs[rank]["RANK"])] = Path(logs.error_files[rank])
            return logs

    return RankLogs(log_dir=str(log_dir), **kwargs)


def _reports(error_files: dict[int, Path]) -> dict[int, tuple[str, float]]:
    """{rank: (the message of its error file, when it was written)} for the ranks that left one."""
    import json

    found = {}
    for rank, path in error_files.items():
        try:
            data = json.loads(path.read_text())
            message = data["message"]
            found[rank] = (message.get("message", "") if isinstance(message, dict) else str(message),
                           path.stat().st_mtime)
        except (OSError, ValueError, KeyError):
            continue
    return found


def announce_restart(run_dir: Path):
    """The runner's own workers: print why the group restarts and from where (hardware.max_restarts)."""

    def announce(restart: int, max_restarts: int, reports: dict[int, tuple[str, float]]) -> None:
        from runner.checkpoint import newest_complete_step
        from runner.launch.failures import restart_line

        print(restart_line(reports, restart, max_restarts, newest_complete_step(run_dir / "checkpoints")),
              file=sys.stderr, flush=True)

    return announce


def run_agent(hardware: Hardware, log_dir: Path, entrypoint: Any, args: tuple, stop_signals,
              rank0_console: bool = False) -> Outcome:
    """Start this machine's workers (`entrypoint(*args)`: a function, or an executable such as sys.executable)
    and wait for them, passing stop signals on and ending them on Ctrl-C."""
    from torch.distributed.launcher.api import elastic_launch

    leave_loky_start_method()
    outcome = Outcome()
    # An Event, not Thread.join: a join interrupted by Ctrl-C can leave the thread looking finished (CPython).
    done = threading.Event()

    # The ranks' error files live as long as the agent: it reads each failure's file as the failure happens
    # (ProcessFailure), so nothing under this folder is needed once it returns, and every run cleans up its own.
    errors_dir = tempfile.TemporaryDirectory(prefix="runner-errors-", ignore_cleanup_errors=True)

    def agent() -> None:
        try:
            config = launch_config(hardware, log_dir, Path(errors_dir.name), rank0_console)
            outcome.results = elastic_launch(config, entrypoint)(*args)
        except BaseException as err:  # handed to the main thread, which reports it
            outcome.error = err
        finally:
            errors_dir.cleanup()
            done.set()

    thread = threading.Thread(target=agent, name="runner-agent", daemon=True)
    threads = threads_per_process(DistInfo(local_world_size=hardware.processes_per_machine), hardware.threads_per_process)
    seen: set[int] = set()  # the workers record_exits has watched: none yet while the agent waits for its peers
    with omp_threads_for_workers(threads), fresh_stores_on_restart(hardware.max_restarts), \
            quiet_torch_launcher_logs(), forward_to_workers(stop_signals, seen) as outcome.forwarded:
        thread.start()
        threading.Thread(target=record_exits, args=(outcome.exited, done, seen), name="runner-exits",
                         daemon=True).start()
        try:
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt:
            end_workers(signal.SIGINT, grace_s=INTERRUPT_GRACE_S)
            done.wait(INTERRUPT_GRACE_S + 10)  # the agent notices and shuts its store down before we exit
            raise
    return outcome


EXIT_WATCH_S = 0.05  # how often new workers are looked for


def record_exits(exited: dict[int, float], done: threading.Event, watched: set[int]) -> None:
    """Until `done`: for each child of this process, the moment it exits, into `exited` (and its pid into
    `watched`). One waiting thread per child, with waitid's WNOWAIT, which leaves the exited child for the agent to
    collect as usual."""
    if not hasattr(os, "waitid"):  # not POSIX: only the launcher's own timestamps
        return

    def wait_for(pid: int) -> None:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # already collected by the agent: its exit time is unknown
            return
        exited.setdefault(pid, time.monotonic())

    while not done.wait(EXIT_WATCH_S):
        for pid in child_pids():
            if pid not in watched:
                watched.add(pid)
                threading.Thread(target=wait_for, args=(pid,), name=f"runner-exit-{pid}", daemon=True).start()


def leave_loky_start_method() -> None:
    """Inside a joblib launcher's (loky) worker the default start method is "loky", from which torch cannot start
    processes (`cannot find context for 'loky'`, pytorch #44687): fall back to spawn there."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) == "loky":
        multiprocessing.set_start_method("spawn", force=True)


@contextmanager
def omp_threads_for_workers(threads: int | None) -> Iterator[None]:
    """OMP_NUM_THREADS for the workers started inside this block, unless the user set it (torchrun does the same;
    None: nothing to say). OpenMP reads it once, when torch loads, so a spawned worker needs it in its environment
    from the start; each runner worker also calls torch.set_num_threads. A forked worker inherits this process's
    OpenMP state instead."""
    if threads is None:
        yield
        return
    with _environment("OMP_NUM_THREADS", str(threads)):
        yield


@contextmanager
def fresh_stores_on_restart(max_restarts: int) -> Iterator[None]:
    """With restarts, gloo workers of a restarted group can meet the previous group's TCP store and hang
    (pytorch#135712): not sharing the rendezvous store with the workers avoids it."""
    if max_restarts <= 0:
        yield
        return
    with _environment("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"):
        yield


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name=value` for the workers started inside this block, unless the user set it."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextmanager
def forward_to_workers(stop_signals, started: set[int]) -> Iterator[list[signal.Signals]]:
    """While the workers run, a stop signal sent to this process (a scheduler's, `kill`) goes on to them; the
    list it yields records which arrived. Before any worker started (`started`: the workers seen so far; none while
    the agent waits at the rendezvous for the other machines), it ends the run at once, as during start-up."""
    received: list[signal.Signals] = []

    def forward(signum, frame) -> None:
        received.append(signal.Signals(signum))
        workers = child_pids()
        if not workers and not started:
            stop_before_training(signum, frame)
        for pid in workers:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    with handling(stop_signals, forward):
        yield received


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
    instead, and each rank's full traceback stays in its own log."""
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
