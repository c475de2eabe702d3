"""The Accelerator: device placement, DDP, autocast, gradient scaling and backward, usable in any loop.

    accelerator = Accelerator()
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for source, targets in data:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(source), targets)
        accelerator.backward(loss)
        optimizer.step()

In fp32 on one CPU process `prepare` hands back the very objects it was given, so the hot path costs nothing.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterator

import torch
from torch import nn

from runner.data.batches import _Batches
from runner.dist import DistInfo
from runner.precision import Precision


def default_device(dist: DistInfo) -> torch.device:
    """This process's CUDA device when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", dist.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class Accelerator:
    def __init__(self, device: str | torch.device | None = None, precision: str = "fp32", dist: DistInfo | None = None):
        self.dist = dist or DistInfo.from_env()
        self.device = torch.device(device) if device is not None else default_device(self.dist)
        self.precision = Precision(precision, self.device.type)
        self.scaler = self.precision.make_scaler()
        self._optimizers: list[ScaledOptimizer] = []

    @property
    def is_main_process(self) -> bool:
        return self.dist.is_main

    @property
    def num_processes(self) -> int:
        return self.dist.world_size

    def print(self, *args, **kwargs) -> None:
        """print() on the main process only."""
        if self.is_main_process:
            builtins.print(*args, **kwargs)

    def prepare(self, *objects: Any) -> Any:
        """Ready models, optimizers, batch sources and schedulers for this device; returned in the order given."""
        prepared = tuple(self._prepare_one(obj) for obj in objects)
        return prepared[0] if len(prepared) == 1 else prepared

    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, nn.Module):
            return self._prepare_model(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return self._prepare_optimizer(obj)
        if isinstance(obj, _Batches):
            return self._on_device(obj.shard(self.dist.rank, self.dist.world_size))
        if isinstance(obj, torch.utils.data.DataLoader):
            return self._on_device(obj)
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or obj is None:
            return obj
        raise TypeError(
            f"Accelerator.prepare() got a {type(obj).__name__}; it takes torch.nn.Module, torch.optim.Optimizer, "
            "torch.utils.data.DataLoader, runner batch sources, LR schedulers and None"
        )

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if self.dist.is_distributed:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        return model

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer):
        if self.scaler is None:
            return optimizer
        wrapped = ScaledOptimizer(optimizer, self.scaler)
        self._optimizers.append(wrapped)
        return wrapped

    def _on_device(self, batches):
        return batches if self.device.type == "cpu" else DeviceBatches(batches, self.device)

    def autocast(self):
        """The precision's autocast context (a no-op in fp32)."""
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm; under fp16 the gradients are unscaled first so the norm is real."""
        for optimizer in self._optimizers:
            optimizer.unscale_gradients()
        return nn.utils.clip_grad_norm_(parameters, max_norm)

    def set_seed(self, seed: int) -> None:
        set_seed(seed)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module, without the DDP wrapper `prepare` may have added."""
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class ScaledOptimizer:
    """An optimizer whose `step()` goes through the GradScaler, so a hand-written loop runs unchanged under fp16."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler):
        self.optimizer = optimizer
        self.scaler = scaler
        self._unscaled = False
        self.step_was_skipped = False

    def unscale_gradients(self) -> None:
        if not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self, closure=None) -> None:
        scale_before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it found inf/nan gradients and skipped the step.
        self.step_was_skipped = self.scaler.get_scale() < scale_before
        self._unscaled = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state


class DeviceBatches:
    """Moves each batch (a tensor, or a dict/list/tuple of them) to the device as it is drawn."""

    def __init__(self, batches, device: torch.device):
        self.batches = batches
        self.device = device

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch, start)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            yield _to_device(batch, self.device)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (every CUDA device too) for a reproducible run."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
