"""How a model is shared by several processes: DDP (every process holds the whole model, gradients averaged).

`DistributedDataParallelKwargs` is Accelerate's name for the same settings, for hand-written loops:
`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn

from runner.config import ParallelConfig, ParallelKind


@dataclass
class DistributedDataParallelKwargs:
    """Accelerate's kwargs handler for DDP; the fields mean what runner.config.ParallelConfig's do."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float | None = None
    broadcast_buffers: bool = True

    def to_config(self) -> ParallelConfig:
        return ParallelConfig(kind=ParallelKind.ddp, **{item.name: getattr(self, item.name) for item in fields(self)})


def ddp_arguments(settings: ParallelConfig) -> dict:
    """The settings that differ from DDP's defaults (torch 2.13 warns about broadcast_buffers passed at all)."""
    defaults = ParallelConfig()
    names = ("find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "broadcast_buffers")
    return {name: getattr(settings, name) for name in names if getattr(settings, name) != getattr(defaults, name)}


def wrap(model: nn.Module, settings: ParallelConfig, device: torch.device, distributed: bool) -> nn.Module:
    """The model as the processes share it (unchanged in a single process)."""
    if not distributed or settings.kind == ParallelKind.none:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **ddp_arguments(settings))


UNUSED_PARAMETER_WORDS = ("Expected to have finished reduction in the prior iteration",
                          "did not receive grad", "find_unused_parameters")


def unused_parameters_hint(err: BaseException) -> str | None:
    """The fix for DDP's error about parameters that got no gradient, or None for any other error."""
    if any(words in str(err) for words in UNUSED_PARAMETER_WORDS):
        return ("some parameters of the model got no gradient in a step (a branch the forward skipped), which DDP "
                "cannot average; set parallel.find_unused_parameters=true (or parallel.static_graph=true when the "
                "same parameters are unused every step)")
    return None
