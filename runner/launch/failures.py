"""Turning a worker's exception into one readable line for the console: which rank, after which step, and the end
of its traceback.

A worker re-raises what went wrong as `RankFailed` (it raised itself) or `PeerLost` (a collective broke because
another rank died). The elastic launcher stores that message per rank; the parent picks the root cause from them,
since the launcher's own "first failure" has one-second resolution and often names a rank that only lost its peer.
"""

from __future__ import annotations

import re
import signal
import traceback
from typing import NamedTuple

from runner.errors import RunnerError, first_line

TRACEBACK_TAIL_LINES = 8
STEP_ATTRIBUTE = "runner_failed_after_step"
FAILURE_ATTRIBUTE = "runner_failure"

# What a collective raises when a peer process is gone (gloo / nccl wording), and when it waited too long.
PEER_LOST_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")
TIMEOUT_WORDS = ("Timed out", "timed out", "Timeout", "timeout")


class RankFailed(RuntimeError):
    """This rank raised. Its message is the whole human-readable report."""


class ResumeRefusedOnRank(RankFailed):
    """This rank refused the checkpoint it was to resume from (errors.ResumeRefused): resume=auto cannot help."""


class PeerLost(RuntimeError):
    """This rank stopped because another one failed."""


class RelayedFailure(RuntimeError):
    """Another rank's report ("[rank] message"), recorded by a peer that ended itself on seeing it (runner/launch/peers.py),
    so the launcher has the root cause even when that peer exits before the rank that failed."""


class PeerHung(RuntimeError):
    """This rank gave up waiting in a collective for a peer that stopped making progress; the message names it."""


def mark_step(err: BaseException, step: int) -> None:
    """Remember on the exception how far training got, without changing its type (the CLI still sees a
    RunnerError as a RunnerError)."""
    try:
        setattr(err, STEP_ATTRIBUTE, step)
    except AttributeError:
        pass


def worker_failure(rank: int, err: BaseException, peers=None, timeout_s: float | None = None) -> RuntimeError:
    """The exception a worker raises in place of `err`, its message ready for the console (worked out once per
    error: the worker reports it to its peers, then to the launcher)."""
    known = getattr(err, FAILURE_ATTRIBUTE, None)
    if known is not None:
        return known
    failure = _failure(rank, err, peers, timeout_s)
    try:
        setattr(err, FAILURE_ATTRIBUTE, failure)
    except AttributeError:
        pass
    return failure


def _failure(rank: int, err: BaseException, peers, timeout_s: float | None) -> RuntimeError:
    step = getattr(err, STEP_ATTRIBUTE, None)
    when = "before the first optimizer step" if step is None else f"after {step} optimizer step(s)"
    said = f"{type(err).__name__}: {first_line(err, default='(no message)')}"
    if _is_peer_lost(err):
        return PeerLost(f"rank {rank} stopped {when}: it lost a peer ({said})")
    hung = peers.hung_rank(timeout_s) if peers is not None and timeout_s and _is_timeout(err) else None
    if hung is not None:
        hung_rank, hung_step, age = hung
        at = "before its first optimizer step" if hung_step is None else f"at optimizer step {hung_step}"
        return PeerHung(f"rank {hung_rank} hung: it made no progress for {age:.0f} s ({at}); rank {rank} gave up "
                        f"waiting for it after hardware.timeout_s={timeout_s:g} s")
    if isinstance(err, RunnerError):  # a user error: its whole message says it all
        kind = RankFailed if err.resume_helps else ResumeRefusedOnRank
        return kind(f"{str(err).strip()} (rank {rank}, {when})")
    headline = f"rank {rank} failed {when}: {said}"
    lines = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()
    lines = [line for line in lines if line.strip(" ^~")]  # drop the caret lines that underline expressions
    tail = "\n".join("    " + line for line in lines[-TRACEBACK_TAIL_LINES:])
    return RankFailed(f"{headline}\n  end of its traceback:\n{tail}")


def _is_timeout(err: BaseException) -> bool:
    return any(word in str(err) for word in TIMEOUT_WORDS)


def _is_peer_lost(err: BaseException) -> bool:
    import torch.distributed as torch_dist

    return isinstance(err, getattr(torch_dist, "DistNetworkError", ())) or any(
        word in str(err) for word in PEER_LOST_WORDS
    )



class RootCause(NamedTuple):
    rank: int
    message: str
    resume_helps: bool = True
    """False when the rank refused its checkpoint (ResumeRefusedOnRank): resume=auto would refuse it again."""


def root_cause(failures: dict[int, object], exited: dict[int, float] | None = None) -> RootCause:
    """(rank, message) of the failure that most likely started it, from the launcher's {rank: ProcessFailure}:
    a rank that raised, else one killed by a signal other than the launcher's SIGTERM, else one that lost a
    peer, else any; within each, the one that exited first (`exited`: {pid: exit time}, runner/launch/agent.py)."""
    exited = exited or {}

    def message(failure) -> str:
        data = failure.message
        text = data.get("message", "") if isinstance(data, dict) else str(data or "")
        # torch's placeholder when a process left no error file (a script without @record, a crash).
        return "" if text.startswith("To enable traceback see") else text

    def category(item) -> tuple[float, float, int, int]:
        rank, failure = item
        text = message(failure)
        if text.startswith((RankFailed.__name__, ResumeRefusedOnRank.__name__)):
            order = 0
        elif text.startswith(RelayedFailure.__name__):
            order = 0.5
        elif text.startswith(PeerHung.__name__):
            order = 1
        elif failure.exitcode < 0 and -failure.exitcode != signal.SIGTERM:
            order = 2
        elif text.startswith(PeerLost.__name__):
            order = 3
        else:
            order = 4
        return order, exited.get(getattr(failure, "pid", None), float("inf")), failure.timestamp, rank

    rank, failure = min(failures.items(), key=category)
    text = message(failure)
    if text.startswith(ResumeRefusedOnRank.__name__ + ": "):
        return RootCause(rank, text[len(ResumeRefusedOnRank.__name__) + 2:], resume_helps=False)
    if text.startswith(RelayedFailure.__name__ + ": ["):
        failed, _, report = text[len(RelayedFailure.__name__) + 3:].partition("] ")
        hung = re.match(r"rank (\d+) hung: ", report)  # relayed by the rank that gave up: name the hung one's log
        return RootCause(int(hung.group(1)) if hung else int(failed), report)
    if text.startswith(PeerHung.__name__ + ": "):
        text = text[len(PeerHung.__name__) + 2:]
        return RootCause(int(text.split()[1]), text)  # "rank N hung: ...": the log worth reading is the hung rank's
    for prefix in (RankFailed.__name__ + ": ", PeerLost.__name__ + ": "):
        if text.startswith(prefix):
            return RootCause(rank, text[len(prefix):])
    if failure.exitcode < 0:
        return RootCause(rank, f"rank {rank} was killed by signal {failure.signal_name()} (exit code {failure.exitcode})")
    return RootCause(rank, f"rank {rank} exited with code {failure.exitcode}" + (f": {text}" if text else ""))


def restart_line(reports: dict[int, tuple[str, float]], restart: int, max_restarts: int, step: int | None) -> str:
    """The console line for a restart of the runner's own workers (hardware.max_restarts): the rank that failed,
    the last line of its error, then "restart k of n from step S". `reports`: {rank: (its error report, when it was
    written)} from the failed attempt's error files (ranks ended by the launcher leave none)."""
    from types import SimpleNamespace

    failures = {rank: SimpleNamespace(exitcode=1, message={"message": text}, timestamp=written, pid=None)
                for rank, (text, written) in reports.items()}
    unreported = "a rank failed without a report (killed, or it crashed)"
    if failures and all(text.startswith(PeerLost.__name__) for text, _ in reports.values()):
        # Every report is of a lost peer: the rank that failed left none (killed by a signal, say).
        failed = f"{unreported}; rank(s) {', '.join(map(str, sorted(reports)))} then lost their peer"
    elif failures:
        cause = root_cause(failures)
        lines = [line.strip() for line in cause.message.strip().splitlines() if line.strip()]
        failed = f"rank {cause.rank} failed: {lines[-1] if lines else '(no message)'}"
    else:
        failed = unreported
    start = "the start (no checkpoint yet)" if step is None else f"step {step}"
    return f"runner: {failed}; restart {restart} of {max_restarts} from {start}"
