"""Typed errors. Each one names what the user got wrong and what would be valid."""

from __future__ import annotations

from dataclasses import dataclass


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


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): "try again later", i.e. requeue with resume=auto


class Preempted(Exception):
    """A stop signal arrived; the run finished its optimizer step, saved, and exits with PREEMPTED_EXIT_CODE.
    Not a RunnerError: nothing is wrong, and the CLI reports it as a stop, not a failure."""

    def __init__(self, signal_name: str, step: int | None, checkpoint):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        saved = f"saved {checkpoint}" if checkpoint else "checkpoints are off, nothing was saved"
        after = f"optimizer step {step}" if step is not None else "the current optimizer step"
        super().__init__(f"stopped by {signal_name} after {after}; {saved}")
