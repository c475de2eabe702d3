"""What each rank of a multi-process run knows about the others, through the store the process group met at.

- A rank that fails says so before it exits; a background thread in every other rank sees it within a fraction of
  a second and ends its process: nobody waits in a collective for a peer that is gone (NCCL would wait until
  hardware.timeout_s), and the launcher has the whole group down within about a second.
- The same thread publishes this rank's progress (its optimizer step and how long ago it last changed), so a rank
  whose collective timed out can name the rank that stopped making progress, and a peer that vanished without a
  word (killed, crashed) is noticed when its beats stop.

The thread touches nothing the training uses; it only reads and writes a few store keys every `BEAT_S`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

BEAT_S = 0.25
MIN_STALE_S = 10.0
PEER_FAILED_EXIT_CODE = 1


def stale_after(timeout_s: float) -> float:
    """How long a peer's beats may stop (without it saying it finished) before it counts as gone: a tenth of
    hardware.timeout_s, at least MIN_STALE_S, at most timeout_s. A fixed 10 s ended healthy groups on a loaded
    machine, where a beat thread can wait that long for the CPU; a peer whose machine vanished is still noticed
    well before its collective would time out."""
    return min(float(timeout_s), max(MIN_STALE_S, timeout_s / 10))


class Peers:
    """This rank's side of the group's bookkeeping. Use as a context manager around the run."""

    def __init__(self, store, rank: int, world_size: int, timeout_s: float = 600):
        self._store, self.rank, self.world_size = store, rank, world_size
        self.stale_s = stale_after(timeout_s)
        self._store_lock = threading.Lock()  # the main thread reports and reads progress; the thread beats
        self._step: Callable[[], int | None] = lambda: None
        self._last_step, self._step_changed = None, time.monotonic()
        self._leaving = False  # failing or finishing: the thread must not end this process any more
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="runner-peers", daemon=True)
        self._seen: dict[int, tuple[str, float]] = {}

    def __enter__(self) -> "Peers":
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.leave("done")
        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S)

    def watch_progress(self, step: Callable[[], int | None]) -> None:
        """Where to read this rank's optimizer step from (the loop's position), once training has started."""
        self._step = step

    def leave(self, how: str) -> None:
        """This rank ends on purpose ("done", "stopped"): its silence from now on is not a failure."""
        self._leaving = True
        self._set(f"left/{self.rank}", how)

    def report_failure(self, message: str) -> None:
        """Tell every peer that this rank failed (they end themselves), before this process exits."""
        self._leaving = True
        self._set(f"failed/{self.rank}", message)
        try:
            self._call("add", "failures", 1)
        except Exception:  # the store went with the launcher: the peers find out from their own errors
            pass

    def progress(self) -> dict[int, tuple[int | None, float]]:
        """{rank: (optimizer step, seconds since it last changed)} as each rank last published it."""
        found = {}
        for rank in range(self.world_size):
            try:
                if not self._call("check", [f"beat/{rank}"]):
                    continue
                _, step, age = self._call("get", f"beat/{rank}").decode().split()
            except Exception:
                continue
            found[rank] = (None if step == "-" else int(step), float(age))
        return found

    def hung_rank(self, waited_s: float) -> tuple[int, int | None, float] | None:
        """(rank, its step, seconds without progress) of the peer that stopped making progress while this one
        waited `waited_s` seconds for it; None when no peer stands out."""
        others = {rank: value for rank, value in self.progress().items() if rank != self.rank}
        if not others:
            return None
        rank, (step, age) = max(others.items(), key=lambda item: item[1][1])
        return (rank, step, age) if age >= 0.5 * waited_s else None

    # -- the background thread ------------------------------------------------------------------------------------

    def _watch(self) -> None:
        last_check = time.monotonic()
        while not self._stop.wait(BEAT_S):
            try:
                self._beat()
                failures = int(self._call("add", "failures", 0))
                gone = self._gone_peers() if time.monotonic() - last_check >= 1.0 else []
            except Exception as err:  # the store is hosted by the launcher (or rank 0): it is gone
                self._end(f"lost the launcher's store ({type(err).__name__}: {err})")
                return
            if time.monotonic() - last_check >= 1.0:
                last_check = time.monotonic()
            if self._leaving:
                continue
            if failures:
                self._relay_failure()
                self._end("another rank failed (its report is the launcher's error message)")
            elif gone:
                self._end(f"rank(s) {', '.join(map(str, gone))} stopped answering for {self.stale_s:.0f} s "
                          f"(a tenth of hardware.timeout_s, at least {MIN_STALE_S:.0f} s)")

    def _beat(self) -> None:
        step = self._step()
        now = time.monotonic()
        if step != self._last_step:
            self._last_step, self._step_changed = step, now
        sequence = getattr(self, "_sequence", 0) + 1
        self._sequence = sequence
        shown = "-" if step is None else str(step)
        self._set(f"beat/{self.rank}", f"{sequence} {shown} {now - self._step_changed:.1f}")

    def _gone_peers(self) -> list[int]:
        now, gone = time.monotonic(), []
        keys = [f"beat/{rank}" for rank in range(self.world_size) if rank != self.rank]
        ranks = [rank for rank in range(self.world_size) if rank != self.rank]
        for rank, key in zip(ranks, keys):
            if not self._call("check", [key]) or self._call("check", [f"left/{rank}"]):
                continue
            sequence = self._call("get", key).decode().split()[0]
            previous = self._seen.get(rank)
            if previous is None or previous[0] != sequence:
                self._seen[rank] = (sequence, now)
            elif now - previous[1] > self.stale_s:
                gone.append(rank)
        return gone

    def other_failure(self, wait_s: float = 0.0):
        """A RelayedFailure carrying the report of another rank that failed, waiting up to `wait_s` for one (a
        rank that only lost its peer usually notices before that peer has said why); None when there is none."""
        from runner.launch.failures import RelayedFailure

        deadline = time.monotonic() + wait_s
        while True:
            try:
                for rank in range(self.world_size):
                    if rank != self.rank and self._call("check", [f"failed/{rank}"]):
                        return RelayedFailure(f"[{rank}] {self._call('get', f'failed/{rank}').decode()}")
            except Exception:  # the store is gone: nothing to relay
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _relay_failure(self) -> None:
        """Record the failed rank's report as this process's own error, for the launcher to find whichever of the
        two exits first."""
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        relayed = self.other_failure()
        if relayed is not None:
            try:
                ErrorHandler().record_exception(relayed)
            except Exception:  # the error file cannot be written: the launcher says less
                pass

    def _set(self, key: str, value: str) -> None:
        try:
            self._call("set", key, value)
        except Exception:
            pass

    def _call(self, method: str, *args):
        with self._store_lock:
            return getattr(self._store, method)(*args)

    def _end(self, why: str) -> None:
        """End this process now, wherever its main thread is (a collective that would wait for a dead peer)."""
        log.error("rank %d stops: %s", self.rank, why)
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PEER_FAILED_EXIT_CODE)


class NoPeers:
    """A single process has no peers to watch."""

    def __enter__(self) -> "NoPeers":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def watch_progress(self, step) -> None:
        pass

    def leave(self, how: str) -> None:
        pass

    def report_failure(self, message: str) -> None:
        pass

    def hung_rank(self, waited_s: float):
        return None

    def other_failure(self, wait_s: float = 0.0):
        return None
