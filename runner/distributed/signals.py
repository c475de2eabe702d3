"""Stop signals (SIGTERM from a scheduler, SIGUSR1 before a time limit) turned into a request the loop honours
after an optimizer step: it saves a checkpoint and the run exits with code 75 (see errors.Preempted).

The handler only records the signal; nothing unsafe runs inside it. With several processes the ranks must stop
after the same step (a rank that stopped alone would leave the others waiting in a collective), so after every
optimizer step each rank starts a one-number all-reduce of "did I get a signal" on a CPU (gloo) group, without
waiting for it, and reads the previous step's result, which finished long ago: every rank sees the same sums in
the same order and stops after the same step, one step after the signal, and no step waits for the device.

Every signal handler the runner installs is installed here (tests/test_layers.py checks it): the process-start
and start-up stops, the loop's StopSignals, a launcher forwarding signals to its workers (`handling`), a failing
rank ignoring the launcher's SIGTERM while it reports (`ignore`), and a worker's single Ctrl-C (`interrupt_once`).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from runner.errors import Preempted

# SIGUSR1 is POSIX-only: where it does not exist, only SIGTERM stops a starting run.
STARTUP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


# submitit asks SLURM for SIGUSR2 before the time limit (`--signal=USR2@120` in the script it writes); its job
# scripts set SUBMITIT_EXECUTOR (slurm) or SUBMITIT_LOCAL_JOB_ID (its local executor).
SUBMITIT_SIGNAL = "SIGUSR2"
SUBMITIT_MARKERS = ("SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_JOB_ID")


def _install(sig: signal.Signals, handler):
    """signal.signal, where Python allows it: only the main thread may set handlers. A run in another thread (a Ray
    Train worker runs the training function in one) keeps the process's handlers; its engine stops it its own way."""
    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(sig)
    return signal.signal(sig, handler)


_submitit_requeue = None
"""submitit's own SIGUSR2 handler, which the runner's stop handler displaces: it requeues the job."""


def stop_signals(configured) -> list[signal.Signals]:
    """checkpoint.stop_signals as signals; under submitit (hydra/launcher=slurm) SIGUSR2 too, so a job nearing its
    time limit stops cleanly, saving a checkpoint, instead of dying; submitit's handler then requeues it
    (hand_over_to_submitit). An empty list stays empty: the user asked for default behaviour."""
    import os

    global _submitit_requeue
    names = [str(getattr(name, "value", name)) for name in configured]
    if names and SUBMITIT_SIGNAL not in names and any(marker in os.environ for marker in SUBMITIT_MARKERS):
        names.append(SUBMITIT_SIGNAL)
        handler = signal.getsignal(signal.Signals[SUBMITIT_SIGNAL])
        if callable(handler) and str(getattr(handler, "__module__", "")).startswith("submitit"):
            _submitit_requeue = handler
    return [signal.Signals[name] for name in names]


def submitit_takes_over(signal_name: str) -> bool:
    """Whether a stop on this signal goes on to submitit's handler (hand_over_to_submitit)."""
    return signal_name == SUBMITIT_SIGNAL and _submitit_requeue is not None


def hand_over_to_submitit(signal_name: str) -> None:
    """After a stop on submitit's SIGUSR2 has sealed its checkpoint: call submitit's handler, as SLURM's signal
    would have without the runner. It requeues the job (exiting the process; the requeued job continues from the
    checkpoint, runner.distributed.dist.requeued_by_submitit), or, where it cannot, records the job as ended, so
    the sweep waiting for it does not wait forever."""
    if submitit_takes_over(signal_name):
        _submitit_requeue(signal.Signals[SUBMITIT_SIGNAL], None)


def stop_before_training(signum, frame=None):
    """What a stop signal does before training starts, wherever it lands (the process starting, the run's start-up,
    a launcher still waiting for the other machines): the run ends at once, exit 75, nothing to save yet."""
    raise Preempted(signal.Signals(signum).name, None, None)


def _stop_at_process_start(signum, frame):
    stop_before_training(signum, frame)


def stop_from_process_start() -> None:
    """`python -m runner`'s first act, before torch and Hydra are imported (seconds) and the config is composed: a
    stop signal from then on raises Preempted ("nothing was trained"), which the entry turns into exit 75, instead
    of killing the process unreported. stop_during_startup takes over around the run itself."""
    for sig in STARTUP_SIGNALS:
        _install(sig, _stop_at_process_start)


@contextmanager
def stop_during_startup() -> Iterator[None]:
    """A stop signal before training starts ends the run at once (exit 75): there is nothing to save yet.
    StopSignals takes over when training starts."""

    def stop(signum, frame):
        stop_before_training(signum, frame)

    previous = {sig: _install(sig, stop) for sig in STARTUP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # After a run, "before training started" would be wrong: the process-start handler is not restored.
            _install(sig, signal.SIG_DFL if handler is _stop_at_process_start else handler)


class StopSignals:
    """Installed by the worker for the run's duration; the loop asks `requested()` after each optimizer step."""

    def __init__(self, names: list[str], distributed: bool = False):
        self.signals = stop_signals(names)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._group = None
        self._pending = None
        self._flag = None
        if distributed and self.signals:
            from runner.distributed.dist import new_cpu_group

            self._group = new_cpu_group()

    def __enter__(self) -> "StopSignals":
        for sig in self.signals:
            self._previous[sig] = _install(sig, self._handle)
        # A start-up signal the run does not stop on (checkpoint.stop_signals=[]) gets its default action from here:
        # the start-up handler would report "before training started" for a run that has trained.
        for sig in STARTUP_SIGNALS:
            if sig not in self.signals:
                _install(sig, signal.SIG_DFL)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._pending is not None and exc_type is None:
            self._pending.wait()  # every rank started it: finish it before the group goes away
        self._pending = None
        for sig, handler in self._previous.items():
            # Once stopping, a repeated signal (the scheduler's, then the launcher's forwarded copy) must not kill
            # the process while it exits with the checkpoint sealed.
            _install(sig, signal.SIG_IGN if self.received is not None else handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def requested(self) -> bool:
        if self._group is None:  # one process, or no stop signals: nothing to agree on
            return self.received is not None
        import torch
        import torch.distributed as torch_dist

        agreed = False
        if self._pending is not None:
            self._pending.wait()
            agreed = self._flag.item() > 0  # a CPU tensor: reading it waits for nothing
        if agreed:
            self._pending = None
            return True
        self._flag = torch.tensor([0.0 if self.received is None else 1.0])
        self._pending = torch_dist.all_reduce(self._flag, group=self._group, async_op=True)
        return False

    def agreed_checks(self, count: int) -> int:
        """How many of an evaluation's `count` batches every rank reaches: the evaluation asks requested() before
        each of those (the same number of times on every rank, as the agreement needs), so a stop signal during a
        long evaluation is honoured within a batch or two rather than after it (a scheduler's grace period can be
        shorter than an evaluation). One blocking MIN over the CPU group per evaluation."""
        if self._group is None:
            return count if self.signals else 0
        import torch
        import torch.distributed as torch_dist

        least = torch.tensor([count], dtype=torch.int64)
        torch_dist.all_reduce(least, op=torch_dist.ReduceOp.MIN, group=self._group)
        return int(least.item())

    @property
    def name(self) -> str:
        return self.received.name if self.received is not None else "a stop signal on another process"


class NoStopSignals:
    """What a loop without signal handling asks: never stop."""

    received = None
    name = ""

    def __enter__(self) -> "NoStopSignals":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def requested(self) -> bool:
        return False

    def agreed_checks(self, count: int) -> int:
        return 0


@contextmanager
def handling(signals, handler) -> Iterator[None]:
    """`handler` for each of `signals` while the block runs; the previous handlers after it."""
    previous = {sig: _install(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, earlier in previous.items():
            _install(sig, earlier)


def ignore(sig: signal.Signals) -> None:
    """From now on `sig` does nothing to this process."""
    _install(sig, signal.SIG_IGN)


def interrupt_once() -> None:
    """Ctrl-C reaches a worker twice: from the terminal (the whole process group) and then from the launcher
    ending its workers. The second must not land in the first one's exit path, where multiprocessing would print
    it as a traceback (seen in tests/launch/test_faults.py's Ctrl-C test): one KeyboardInterrupt, then SIGINT is ignored."""

    def interrupt(signum, frame) -> None:
        ignore(signal.SIGINT)
        raise KeyboardInterrupt

    _install(signal.SIGINT, interrupt)
