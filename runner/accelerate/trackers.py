"""Accelerate's experiment trackers (`log_with`, `init_trackers`, `log`, `end_training`), on TensorBoard only.

    accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
    accelerator.init_trackers("my_run", config={"lr": 0.1})   # writes runs/my_run/ (main process only)
    accelerator.log({"loss": 0.5}, step=3)
    accelerator.end_training()

The rank is decided once, in init_trackers (only the main process gets a tracker), as runner/training/metrics.py does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import ConfigError, Problem

SUPPORTED = ("tensorboard",)


def kinds(log_with: str | list | None) -> list[str]:
    """The tracker names `log_with` asks for ("all" means every supported one); anything else is refused."""
    if log_with is None:
        return []
    names = [log_with] if isinstance(log_with, str) else list(log_with)
    names = [str(getattr(name, "value", name)).lower() for name in names]
    if "all" in names:
        return list(SUPPORTED)
    unsupported = [name for name in names if name not in SUPPORTED]
    if unsupported:
        raise ConfigError(Problem("Accelerator(log_with)", (
            f"got {unsupported}; runner.Accelerator writes TensorBoard only: use log_with=\"tensorboard\" (or "
            "\"all\"), or log to the other tracker yourself on accelerator.is_main_process")))
    return names


class TensorBoardTracker:
    """Scalars (and the config as hparams) to a TensorBoard event file under `logging_dir/run_name`."""

    name = "tensorboard"

    def __init__(self, run_name: str, logging_dir: Path, config: dict | None = None, **kwargs):
        from torch.utils.tensorboard import SummaryWriter

        self.logging_dir = Path(logging_dir) / run_name
        self.writer = SummaryWriter(log_dir=str(self.logging_dir), **kwargs)
        if config:
            from runner.ground import flatten_hparams

            # run_name=".": the hparams in this run's own directory; add_hparams' default makes a new
            # timestamped subdirectory, which TensorBoard then lists as a separate run.
            self.writer.add_hparams(flatten_hparams(config), {}, run_name=".")

    @property
    def tracker(self):
        return self.writer

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs) -> None:
        for tag, value in values.items():
            if isinstance(value, (int, float)) or getattr(value, "ndim", None) == 0:
                self.writer.add_scalar(tag, float(value), global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(tag, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(tag, value, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


def start(names: list[str], run_name: str, project_dir: Path | None, config: dict | None,
          init_kwargs: dict | None) -> list[TensorBoardTracker]:
    """The trackers for `names`, writing under `project_dir` (refused when there is none to write in)."""
    if names and project_dir is None:
        raise ConfigError(Problem("Accelerator(project_dir)", (
            "is needed with log_with=\"tensorboard\": it is the directory the event files are written under; "
            "give Accelerator(log_with=\"tensorboard\", project_dir=\"runs\")")))
    init_kwargs = init_kwargs or {}
    return [TensorBoardTracker(run_name, project_dir, config, **init_kwargs.get(name, {})) for name in names]
