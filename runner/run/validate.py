"""A run's config checked as far as it can be without training: every cross-field check, every target built (the
model on the meta device, so a billion parameters cost nothing), the data built, and one batch's shapes through
the model. A broken recipe fails here with the same message as a real run.

Used by the tests that compose every recipe with every config group option, and by the recipe commands.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runner.config.instantiate import build_data, build_model, build_optimizer, build_scheduler, build_task
from runner.run.checks import check
from runner.config import RunConfig
from runner.data.batches import make_batches
from runner.data.shapes import fill_from_data, sizes_wanted
from runner.distributed.devices import Hardware
from runner.training.loop import planned_steps
from runner.training.batch_plan import BatchPlan, batch_plan


@dataclass
class Validated:
    model: nn.Module
    """Built on the meta device: parameters have shapes, no storage."""
    batch: BatchPlan
    total_steps: int
    splits: object

    @property
    def parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.model.parameters())


def validate(config: RunConfig, hardware: Hardware, build_the_data: bool = True) -> Validated:
    """Raise the run's own RunnerError for anything that would stop it before its first step."""
    check(config, hardware)
    plan = batch_plan(config.trainer, hardware.world_size)
    # A model whose sizes the data fills cannot be built without the data.
    splits = build_data(config.data) if build_the_data or sizes_wanted(config.model) else None
    model_node = config.model if splits is None else fill_from_data(config.model, splits["train"], config.task)
    with torch.device("meta"):
        model = build_model(model_node)
    optimizer = build_optimizer(config.optimizer, model)
    task = build_task(config.task)
    if splits is None:
        scheduler_steps = config.trainer.max_steps or 1
        build_scheduler(config.scheduler, optimizer, scheduler_steps)
        return Validated(model, plan, scheduler_steps, None)
    train = make_batches(splits["train"], plan.per_device, True, config.seed, config.trainer.data_in_memory_mb)
    _, total_steps = planned_steps(config.trainer, len(train), plan.accumulation)
    build_scheduler(config.scheduler, optimizer, total_steps)
    check_fit = getattr(task, "check_fit", None)
    if check_fit is not None:
        model.eval()
        check_fit(model, next(iter(train)), model_node, config.data)
    return Validated(model, plan, total_steps, splits)
