"""Stop signals (SIGTERM from a scheduler, SIGUSR1 before a time limit) turned into a request the loop honours
after the current optimizer step: it saves a checkpoint and the run exits with code 75 (see errors.Preempted).

The handler only records the signal; nothing unsafe runs inside it. With several processes the ranks agree on
stopping with one small all-reduce every `check_every` optimizer steps (the loop passes its log cadence, where it
reads the device anyway), so every rank stops after the same step and no step pays a host-device sync for it.
"""

from __future__ import annotations

import signal

import torch

from runner.dist import all_reduce_sum


class StopSignals:
    """Installed by the worker for the run's duration; the loop asks `requested(step)` after each optimizer step."""

    def __init__(self, names: list[str], distributed: bool = False, device: torch.device | str = "cpu",
                 check_every: int = 1):
        self.signals = [signal.Signals[str(getattr(name, "value", name))] for name in names]
        self.distributed, self.device = distributed, torch.device(device)
        self.check_every = max(1, check_every)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> "StopSignals":
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def requested(self, step: int = 0) -> bool:
        if not self.distributed or not self.signals:  # every rank has the same signal list: no need to agree
            return self.received is not None
        if step % self.check_every:
            return False  # every rank skips the same steps, so they still agree on where to stop
        flag = torch.tensor([0.0 if self.received is None else 1.0], device=self.device)
        return all_reduce_sum(flag).item() > 0

    @property
    def name(self) -> str:
        return self.received.name if self.received is not None else "a stop signal on another process"


class NoStopSignals:
    """What a loop without signal handling asks: never stop."""

    received = None
    name = ""

    def requested(self, step: int = 0) -> bool:
        return False
