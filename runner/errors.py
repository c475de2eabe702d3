"""Typed errors. Each one names what the user got wrong and what would be valid."""

from __future__ import annotations

import errno
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class RunnerError(Exception):
    """Base class: an error the user can fix. The CLI prints it without a traceback."""


@dataclass(frozen=True)
class Problem:
    """One bad setting: the full config key and what is wrong with it, fix included."""

    key: str
    message: str

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


class WriteError(RunnerError):
    """A file of the run (checkpoint, export, metrics, TensorBoard, config) could not be written."""


class DiskFull(WriteError):
    """The disk (or the user's quota) is full: free space, then resume=auto continues from the last checkpoint."""


class NonFiniteLoss(RunnerError):
    """The training loss became NaN or infinite (trainer.on_nonfinite=stop)."""


DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def write_error(err: OSError, path: Path | str, what: str) -> WriteError:
    """The one-line error for an OSError while writing `path` (`what`: e.g. "checkpoint step 40")."""
    if err.errno in DISK_FULL_ERRNOS:
        return DiskFull(f"no space left on the disk holding {path} while writing {what}")
    return WriteError(f"could not write {path} while writing {what}: {err.strerror or err}")


@contextmanager
def write_failure(path: Path | str, what: str) -> Iterator[None]:
    """Turn an OSError raised inside the block into a WriteError (DiskFull for ENOSPC/EDQUOT) naming the file."""
    try:
        yield
    except OSError as err:
        raise write_error(err, path, what) from err


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): "try again later", i.e. requeue with resume=auto
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class Preempted(Exception):
    """A stop signal arrived; the run finished its optimizer step, saved, and exits with PREEMPTED_EXIT_CODE.
    Not a RunnerError: nothing is wrong, and the CLI reports it as a stop, not a failure."""

    def __init__(self, signal_name: str, step: int | None, checkpoint):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        if step is None:
            text = f"stopped by {signal_name} before training started; nothing was trained or saved"
        else:
            saved = f"saved {checkpoint}" if checkpoint else "checkpoints are off, nothing was saved"
            text = f"stopped by {signal_name} after optimizer step {step}; {saved}"
        super().__init__(text)
