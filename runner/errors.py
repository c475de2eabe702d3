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
