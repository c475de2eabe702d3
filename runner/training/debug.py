"""Debug runs and reproducibility: trainer.overfit_batches, trainer.fast_dev_run, trainer.deterministic.

The limits themselves (limit_train_batches, limit_val_batches, fast_dev_run's step and batch counts) are applied
where they are counted: runner/training/loop.py (planned_steps, Loop.evaluate_metrics).
"""

from __future__ import annotations

import logging
import os

from runner.config import TrainerConfig
from runner.training.batch_plan import BatchPlan

log = logging.getLogger(__name__)


def overfit_splits(splits, trainer: TrainerConfig, batch: BatchPlan):
    """trainer.overfit_batches=N: the first N global micro-batches of `train`, as both train and validation (the
    caller turns shuffling off), so the loss must go to about zero."""
    if trainer.overfit_batches is None:
        return splits
    if not hasattr(splits["train"], "select"):
        from runner.errors import ConfigError

        raise ConfigError("trainer.overfit_batches", (
            f"works on row datasets (tables, images, generated sequences); this data ({type(splits['train']).__name__}: "
            "a token stream or padded texts) has no rows to pick; use trainer.limit_train_batches instead"))
    rows = min(len(splits["train"]), trainer.overfit_batches * batch.per_device * batch.processes)
    train = splits["train"].select(range(rows))
    log.info("overfit_batches=%d: training and evaluating on the first %d training samples", trainer.overfit_batches,
             rows)
    return {**splits, "train": train, "validation": train}


def apply_determinism(enabled: bool) -> None:
    """trainer.deterministic: kernels that give the same result every time, or an error where torch has none."""
    if not enabled:
        return
    import torch

    # cuBLAS needs a fixed workspace for deterministic matmuls; it reads this when CUDA initialises (torch docs,
    # "Reproducibility"), so it is set before any CUDA work and only if the user has not chosen one.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    log.info("trainer.deterministic: torch.use_deterministic_algorithms(True), cuDNN benchmark off")


def fast_dev_run_note(trainer: TrainerConfig) -> str | None:
    if trainer.fast_dev_run is None:
        return None
    return (f"fast_dev_run: {trainer.fast_dev_run} train and {trainer.fast_dev_run} eval batch(es); no checkpoints, "
            "exports, metrics files or loggers")
