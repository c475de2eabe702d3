"""Accelerate's experiment trackers (`log_with`, `init_trackers`, `log`, `end_training`): TensorBoard, and tracker
objects of the user's own (Accelerate's GeneralTracker subclasses) called as Accelerate calls them.

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


def kinds(log_with: str | list | None) -> list:
    """The trackers `log_with` asks for: names ("all" means every supported one) and tracker objects of the
    user's own (Accelerate's GeneralTracker subclasses, or any object with log() and store_init_configuration(),
    kept as given); any other name is refused."""
    if log_with is None:
        return []
    given = [log_with] if isinstance(log_with, str) else list(log_with)
    own = [tracker for tracker in given if is_own_tracker(tracker)]
    names = [str(getattr(name, "value", name)).lower() for name in given if not is_own_tracker(name)]
    if "all" in names:
        names = list(SUPPORTED)
    unsupported = [name for name in names if name not in SUPPORTED]
    if unsupported:
        raise ConfigError(Problem("Accelerator(log_with)", (
            f"got {unsupported}; runner.Accelerator writes TensorBoard itself: use log_with=\"tensorboard\" (or "
            "\"all\"), or pass a tracker object of your own (an accelerate GeneralTracker subclass, or any object "
            "with log(values, step) and store_init_configuration(config))")))
    return names + own


def is_own_tracker(tracker: Any) -> bool:
    return callable(getattr(tracker, "log", None)) and callable(getattr(tracker, "store_init_configuration", None))


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


def start(wanted: list, run_name: str, project_dir: Path | None, config: dict | None,
          init_kwargs: dict | None) -> list:
    """The trackers for `wanted` (from kinds()): TensorBoard writing under `project_dir` (refused when there is none
    to write in), and the user's own tracker objects, given the config as Accelerate gives it."""
    own = [tracker for tracker in wanted if is_own_tracker(tracker)]
    for tracker in own:
        if config is not None:
            tracker.store_init_configuration(config)
    names = [name for name in wanted if not is_own_tracker(name)]
    if names and project_dir is None:
        raise ConfigError(Problem("Accelerator(project_dir)", (
            "is needed with log_with=\"tensorboard\": it is the directory the event files are written under; "
            "give Accelerator(log_with=\"tensorboard\", project_dir=\"runs\")")))
    init_kwargs = init_kwargs or {}
    return [TensorBoardTracker(run_name, project_dir, config, **init_kwargs.get(name, {})) for name in names] + own
