"""Typed errors. Each one names what the user got wrong and what would be valid."""

from __future__ import annotations

import errno
import sys
from typing import Any, NoReturn
from dataclasses import dataclass
from pathlib import Path


class RunnerError(Exception):
    """Base class: an error the user can fix. The CLI prints it without a traceback."""

    keep: tuple[Path, ...] = ()
    """Files the message tells the user to read (a rank's log): kept when a failure before training removes the
    run dir this invocation created."""
    resume_helps: bool = True
    """Whether running the same command with resume=auto may get past it (the final message then suggests it)."""
    names_run_dir_state: bool = True
    """Whether the final message adds what the run dir holds (its newest checkpoint): not when the error is about
    those very checkpoints and says more than that line would."""


@dataclass(frozen=True)
class Problem:
    """One bad setting: the full config key and what is wrong with it, fix included."""

    key: str
    message: str
    of_this_machine: bool = False
    """What this machine lacks (a package, the Hub, a GPU), not what the settings say: a recipe's group swapped on
    the command line is never its cause (runner.run.compose.with_recipe)."""

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class ConfigError(RunnerError):
    """One or more bad settings, all reported at once."""

    def __init__(self, problems: list[Problem] | Problem | str, message: str | None = None):
        if isinstance(problems, str):
            problems = [Problem(problems, message or "is not valid")]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return f"bad config: {self.problems[0]}"
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        return f"bad config ({len(self.problems)} problems):\n{lines}"


class DataError(RunnerError):
    """A dataset could not be found or loaded."""


class HardwareError(RunnerError):
    """The machine lacks what the run asked for (a GPU, torch_xla, fp8 support), found once a worker started."""


class LaunchError(RunnerError):
    """Processes could not be started, or a rank failed."""


class CheckpointError(RunnerError):
    """A checkpoint could not be written or read back."""


class ResumeRefused(CheckpointError):
    """A checkpoint this run cannot continue from (altered after it was written, or not exactly on this process
    count): resume=auto would meet the same refusal, so the message does not suggest it."""

    resume_helps = False


class NoIntactCheckpoint(ResumeRefused):
    """Every checkpoint of a run is damaged: the message says what can be done, and the run dir's "last complete
    checkpoint is step N" line is left out (it would name a damaged one)."""

    names_run_dir_state = False


class WriteError(RunnerError):
    """A file of the run (checkpoint, export, metrics, TensorBoard, config) could not be written."""


class DiskFull(WriteError):
    """The disk (or the user's quota) is full: free space, then resume=auto continues from the last checkpoint."""


class NonFiniteLoss(RunnerError):
    """The training loss became NaN or infinite (trainer.on_nonfinite=stop)."""


DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


ALMOST_FULL_BYTES = 2**20


def yaml_problem(err: BaseException) -> tuple[Any, str]:
    """Where PyYAML stopped reading (its Mark: file name, 0-based line and column; None if it gave none) and what it
    found there, from a yaml.YAMLError."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    found = " ".join(filter(None, [getattr(err, "context", None), getattr(err, "problem", None)]))
    return mark, (found or first_line(err)).strip()


def first_line(err: BaseException, default: str = "") -> str:
    """The first line of an error's message (`default` for none): what a one-line report of it shows. Hydra's and
    OmegaConf's messages put what went wrong first, then "full_key: ..."; that first part is kept whole."""
    text = str(err).strip()
    if "\nfull_key" in text:
        return text.split("\nfull_key")[0].replace("\n", " ")
    lines = text.splitlines()
    return lines[0] if lines else default


def write_error(err: Exception, path: Path | str, what: str) -> WriteError:
    """The one-line error for a failed write of `path` (`what`: e.g. "checkpoint step 40"). Call it before
    removing partial files: libraries that write through their own streams (torch.save, safetensors) raise a
    RuntimeError on a full disk, so a disk left with almost no free space is taken for the cause."""
    if getattr(err, "errno", None) in DISK_FULL_ERRNOS or _names_a_full_disk(err) or _almost_full(Path(path)):
        return DiskFull(f"no space left on the disk holding {path} while writing {what}")
    reason = getattr(err, "strerror", None) or first_line(err)
    return WriteError(f"could not write {path} while writing {what}: {reason}")


def _names_a_full_disk(err: Exception) -> bool:
    """safetensors' SafetensorError carries the OS error only in its text ("... No space left on device ...")."""
    import os

    return any(os.strerror(code) in str(err) for code in DISK_FULL_ERRNOS)


def _almost_full(path: Path) -> bool:
    import os

    for candidate in (path, *path.parents):
        try:
            usage = os.statvfs(candidate)
        except OSError:
            continue
        return usage.f_bavail * usage.f_frsize < ALMOST_FULL_BYTES
    return False


class write_failure:
    """A context that turns an error raised while writing inside it into a WriteError (DiskFull when the disk is
    full) naming the file. A class, not a generator-based context manager: the metrics sinks enter one for every
    row they log, inside the training loop, where a generator's set-up costs tens of microseconds a row."""

    def __init__(self, path: Path | str, what: str):
        self.path, self.what = path, what

    def __enter__(self) -> "write_failure":
        return self

    def __exit__(self, kind, err, traceback) -> bool:
        if isinstance(err, (OSError, RuntimeError)) and not isinstance(err, RunnerError):
            raise write_error(err, self.path, self.what) from err
        return False


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): "try again later", i.e. requeue with resume=auto
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
BROKEN_PIPE_EXIT_CODE = 141  # 128 + SIGPIPE, what a shell reports for a program whose reader left (`| head`)


class Preempted(BaseException):
    """A stop signal arrived; the run finished its optimizer step, saved, and exits with PREEMPTED_EXIT_CODE.
    Not an error: like KeyboardInterrupt it is a BaseException, so no `except Exception` on its way up (a library's,
    a data loader's) mistakes it for a failure."""

    def __init__(self, signal_name: str, step: int | None, checkpoint):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        if step is None:
            text = f"stopped by {signal_name} before training started; nothing was trained or saved"
        else:
            saved = f"saved {checkpoint}" if checkpoint else "checkpoints are off, nothing was saved"
            text = f"stopped by {signal_name} after optimizer step {step}; {saved}"
        super().__init__(text)


def print_error(message: BaseException | str) -> None:
    """The one format of a runner error on the console: `runner: error: ` and one paragraph, on stderr."""
    print(f"runner: error: {message}", file=sys.stderr)


def exit_with(message: BaseException | str, code: int = 1) -> NoReturn:
    """How every runner command (and the sweep callback, whose other exceptions Hydra only warns about) ends on an
    error: the paragraph, then exit `code`."""
    print_error(message)
    raise SystemExit(code)


def no_stray_tracebacks() -> None:
    """A log line that cannot be written, or a library's background thread that dies (TensorBoard's writer on a
    full disk), must not print a traceback: the write that matters raises the same problem from the main thread,
    as one message. Process-wide: the CLI and each worker call it once at start."""
    import logging
    import threading

    logging.raiseExceptions = False

    def quietly(args) -> None:
        name = args.thread.name if args.thread is not None else "?"
        logging.getLogger("runner").debug("background thread %s stopped: %s: %s", name, args.exc_type.__name__,
                                          args.exc_value)

    threading.excepthook = quietly

    previous = sys.unraisablehook

    def interrupt_quietly(unraisable) -> None:
        # Ctrl-C landing inside a finalizer or weakref callback (Python cannot raise it there): it is already
        # being handled (the launcher ends every rank), so no "Exception ignored in ..." traceback on the console.
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            logging.getLogger("runner").debug("Ctrl-C during %r, ignored", unraisable.object)
            return
        previous(unraisable)

    sys.unraisablehook = interrupt_quietly
