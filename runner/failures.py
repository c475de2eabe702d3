"""Turning a worker's exception into one readable line for the console: which rank, after which step, and the end
of its traceback.

A worker re-raises what went wrong as `RankFailed` (it raised itself) or `PeerLost` (a collective broke because
another rank died). The elastic launcher stores that message per rank; the parent picks the root cause from them,
since the launcher's own "first failure" has one-second resolution and often names a rank that only lost its peer.
"""

from __future__ import annotations

import signal
import traceback

from runner.errors import RunnerError

TRACEBACK_TAIL_LINES = 8
PEER_LOST_GRACE_S = 2.0  # how long a rank that lost its peer waits before exiting (see worker.run_spawned)
STEP_ATTRIBUTE = "runner_failed_after_step"

# What a collective raises when a peer process is gone (gloo / nccl wording).
PEER_LOST_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")


class RankFailed(RuntimeError):
    """This rank raised. Its message is the whole human-readable report."""


class PeerLost(RuntimeError):
    """This rank stopped because another one failed."""


def mark_step(err: BaseException, step: int) -> None:
    """Remember on the exception how far training got, without changing its type (the CLI still sees a
    RunnerError as a RunnerError)."""
    try:
        setattr(err, STEP_ATTRIBUTE, step)
    except AttributeError:
        pass


def worker_failure(rank: int, err: BaseException) -> RuntimeError:
    """The exception a worker raises in place of `err`, its message ready for the console."""
    step = getattr(err, STEP_ATTRIBUTE, None)
    when = "before the first optimizer step" if step is None else f"after {step} optimizer step(s)"
    if _is_peer_lost(err):
        return PeerLost(f"rank {rank} stopped {when}: it lost a peer ({type(err).__name__}: {_first_line(err)})")
    if isinstance(err, RunnerError):  # a user error: its whole message says it all
        return RankFailed(f"rank {rank} failed {when}: {type(err).__name__}: {str(err).strip()}")
    headline = f"rank {rank} failed {when}: {type(err).__name__}: {_first_line(err)}"
    lines = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()
    lines = [line for line in lines if line.strip(" ^~")]  # drop the caret lines that underline expressions
    tail = "\n".join("    " + line for line in lines[-TRACEBACK_TAIL_LINES:])
    return RankFailed(f"{headline}\n  end of its traceback:\n{tail}")


def _is_peer_lost(err: BaseException) -> bool:
    import torch.distributed as torch_dist

    return isinstance(err, getattr(torch_dist, "DistNetworkError", ())) or any(
        word in str(err) for word in PEER_LOST_WORDS
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


def root_cause(failures: dict[int, object]) -> tuple[int, str]:
    """(rank, message) of the failure that most likely started it, from the launcher's {rank: ProcessFailure}:
    a rank that raised, else one killed by a signal other than the launcher's SIGTERM, else one that lost a
    peer, else any."""

    def message(failure) -> str:
        data = failure.message
        return data.get("message", "") if isinstance(data, dict) else str(data or "")

    def category(item) -> tuple[int, int, int]:
        rank, failure = item
        text = message(failure)
        if text.startswith(RankFailed.__name__):
            order = 0
        elif failure.exitcode < 0 and -failure.exitcode != signal.SIGTERM:
            order = 1
        elif text.startswith(PeerLost.__name__):
            order = 2
        else:
            order = 3
        return order, failure.timestamp, rank

    rank, failure = min(failures.items(), key=category)
    text = message(failure)
    for prefix in (RankFailed.__name__ + ": ", PeerLost.__name__ + ": "):
        if text.startswith(prefix):
            return rank, text[len(prefix):]
    if failure.exitcode < 0:
        return rank, f"rank {rank} was killed by signal {failure.signal_name()} (exit code {failure.exitcode})"
    return rank, f"rank {rank} exited with code {failure.exitcode}" + (f": {text}" if text else "")
