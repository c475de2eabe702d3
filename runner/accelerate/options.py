"""Accelerate's configuration objects, under Accelerate's names, as plain dataclasses the Accelerator reads once.

    Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True),
                gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4, sync_each_batch=True),
                kwargs_handlers=[GradScalerKwargs(init_scale=1024), DistributedDataParallelKwargs(...)])

Each field means what Accelerate documents for it; where the runner differs, the docstring says so.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from enum import Enum
from typing import Any

import torch

from runner.config import ParallelConfig
from runner.errors import ConfigError, Problem


@dataclass
class DataLoaderConfiguration:
    """How `prepare(DataLoader)` shares a loader's batches among the processes (runner/accelerate/dataloader.py)."""

    split_batches: bool = False
    """False: each process draws whole batches of the loader's batch size (the global batch is N times it).
    True: each batch of the loader is split among the processes (its size must divide by N)."""
    dispatch_batches: bool | None = None
    """True: only the main process iterates the loader and sends each process its part of every step
    (runner/accelerate/dispatch.py, Accelerate's DataLoaderDispatcher). None and False: every process iterates the
    loader and keeps its share, also for an IterableDataset, where Accelerate's None means True (the batches each
    process gets are the same; only the completion of the last one differs)."""
    even_batches: bool = True
    """Repeat samples from the start so every process gets as many batches, of one size; gather_for_metrics
    drops the repeats. False: the last batches are uneven (see join_uneven_inputs)."""
    use_seedable_sampler: bool = False
    """Shuffle with a generator seeded from `data_seed` (else torch.initial_seed()) plus the epoch."""
    data_seed: int | None = None
    non_blocking: bool = False
    """Copy batches to the GPU with non_blocking=True (useful with pin_memory=True)."""
    use_stateful_dataloader: bool = False
    """Accelerate's True (a torchdata StatefulDataLoader whose position save_state keeps) is not supported: resume
    mid-epoch with skip_first_batches."""

    def __post_init__(self) -> None:
        if self.use_stateful_dataloader:
            raise ConfigError(Problem("DataLoaderConfiguration.use_stateful_dataloader", (
                "True is not supported: runner.Accelerator has no stateful DataLoader (torchdata) and save_state "
                "does not record a position in the epoch. Use use_stateful_dataloader=False, and resume mid-epoch "
                "with accelerator.skip_first_batches(loader, batches_done)")))


@dataclass
class GradientAccumulationPlugin:
    num_steps: int | None = None
    adjust_scheduler: bool = True
    """Accepted; the runner's prepared scheduler already steps only on real optimizer steps."""
    sync_with_dataloader: bool = True
    """End the accumulation cycle (sync and step) at the last batch of a prepared DataLoader."""
    sync_each_batch: bool = False
    """All-reduce gradients on every micro-batch (more traffic, less memory under no_sync); still step once."""


@dataclass
class ProjectConfiguration:
    """Accelerate's: where `save_state()` writes when it is given no directory. With automatic_checkpoint_naming,
    save_state() writes <project_dir>/checkpoints/checkpoint_<iteration> and counts up, load_state() reads the
    newest, and total_limit keeps only the newest N (the older ones are removed after the new one is sealed, so
    there are never fewer than N intact)."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0


@dataclass
class GradScalerKwargs:
    """torch.amp.GradScaler's settings under fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


class DistributedType(str, Enum):
    """How the processes share the work, as `accelerator.distributed_type` reports it. Every member of Accelerate's
    enum is here, so a script's comparisons (`== DistributedType.DEEPSPEED`) work; the runner reports NO,
    MULTI_CPU, MULTI_GPU, FSDP and XLA."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


def distributed_type(device_type: str, num_processes: int, parallel_kind: str) -> DistributedType:
    if device_type == "xla":
        return DistributedType.XLA
    if num_processes == 1:
        return DistributedType.NO
    if parallel_kind == "fsdp":
        return DistributedType.FSDP
    return DistributedType.MULTI_GPU if device_type == "cuda" else DistributedType.MULTI_CPU


def accumulation_steps(steps: int | None, legacy: int, plugin: GradientAccumulationPlugin | None):
    """The accumulation count and plugin from either way of giving it (not both, as in Accelerate)."""
    for name, value in (("gradient_accumulation_steps", steps), ("grad_accum_steps", legacy)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(Problem(f"Accelerator({name})", f"is {value!r}; it must be a whole number, 1 or more"))
    if steps is not None and legacy != 1 and steps != legacy:
        raise ConfigError(Problem("Accelerator(gradient_accumulation_steps)", (
            f"is {steps} and grad_accum_steps is {legacy}: give the count once")))
    if plugin is not None:
        if steps not in (None, 1):
            raise ConfigError(Problem("Accelerator(gradient_accumulation_plugin)", (
                f"is given together with gradient_accumulation_steps={steps}; give the count once, as "
                "GradientAccumulationPlugin(num_steps=...) or as gradient_accumulation_steps")))
        return plugin.num_steps or 1, plugin
    count = steps or legacy
    return count, GradientAccumulationPlugin(num_steps=count)


def split_handlers(kwargs_handlers: list | None) -> tuple[ParallelConfig | None, GradScalerKwargs | None]:
    """DDP's settings and the GradScaler's from Accelerate-style kwargs handlers; anything else is refused."""
    from runner.accelerate.parallel import DistributedDataParallelKwargs

    ddp, scaler = None, None
    for handler in kwargs_handlers or []:
        # Accelerate's own handler objects, read as the runner's of the same name (as_own refuses what they set
        # that the runner's lack).
        own = {"DistributedDataParallelKwargs": DistributedDataParallelKwargs, "GradScalerKwargs": GradScalerKwargs}
        if type(handler).__name__ in own and type(handler).__module__.startswith("accelerate"):
            handler = as_own(handler, own[type(handler).__name__], "kwargs_handlers")
        if isinstance(handler, DistributedDataParallelKwargs):
            ddp = handler.to_config()
        elif isinstance(handler, GradScalerKwargs):
            scaler = handler
        else:
            raise ConfigError(Problem("Accelerator(kwargs_handlers)", (
                f"got a {type(handler).__name__}; runner.Accelerator takes DistributedDataParallelKwargs and "
                "GradScalerKwargs (from runner import ...)")))
    return ddp, scaler


def make_scaler(scaler: torch.amp.GradScaler | None, device_type: str, settings: GradScalerKwargs | None):
    """The precision's GradScaler (None unless fp16), with GradScalerKwargs' settings when given."""
    if scaler is None or settings is None:
        return scaler
    return torch.amp.GradScaler(device_type, **asdict(settings))


def as_own(config: Any, own: type, argument: str) -> Any:
    """Accelerate's own configuration object (accelerate.DataLoaderConfiguration, GradientAccumulationPlugin,
    ProjectConfiguration, GradScalerKwargs) as the runner's class of the same name: every field the runner's has is
    copied (and checked as the runner checks it); a field it lacks that is set to anything but its default is
    refused, naming it. Never ignored. The runner's own objects, and None, pass through."""
    if config is None or isinstance(config, own) or not is_dataclass(config):
        return config
    known = {item.name for item in fields(own)}
    unsupported = []
    for item in fields(config):
        value = getattr(config, item.name)
        default = item.default_factory() if item.default_factory is not MISSING else item.default
        if item.name not in known and value != default and not (value is None and default is MISSING):
            unsupported.append(f"{item.name}={value!r}")
    if unsupported:
        raise ConfigError(Problem(f"Accelerator({argument})", (
            f"{type(config).__module__}.{type(config).__name__} sets {', '.join(unsupported)}, which "
            f"runner.Accelerator does not support; leave them at their defaults (the runner's {own.__name__} lists "
            "what it supports)")))
    return own(**{name: getattr(config, name) for name in known if hasattr(config, name)})
