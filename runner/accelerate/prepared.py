"""The wrappers `Accelerator.prepare` may hand back: they exist only when the plain object would do the wrong thing.

- `AcceleratedOptimizer`: steps through the GradScaler (fp16) or torch_xla, and does nothing on the micro-steps of an
  accumulation cycle that are not the last, so an Accelerate-style loop (`optimizer.step()` every batch) works.
- `AcceleratedScheduler`: steps with each real optimizer step (not per micro-step, not after a skipped fp16 step),
  `num_processes` times unless the batches are split (Accelerate's convention, see its docstring).
- `DeviceBatches`: moves each batch to the device as it is drawn.

A prepared DataLoader is runner/accelerate/dataloader.py's `PreparedDataLoader`. `BatchSource` is what `prepare`
accepts besides torch's own types: a source of whole batches that deals itself out to the processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch.utils import _pytree as pytree


class BatchSource:
    """A source of ready batches that knows how to give each process its share (runner/data/batches.py's
    sources are the ones the runner builds). `Accelerator.prepare` calls `shard` and moves each batch to the
    device; it knows nothing else of the source, so the data layer sits above this one."""

    def shard(self, rank: int, world_size: int) -> "BatchSource":
        raise NotImplementedError


@dataclass
class SharedState:
    """What the Accelerator and the objects it prepared need to agree on (`accelerator.gradient_state`)."""

    sync_gradients: bool = True
    """False on the micro-steps of an accumulation cycle that are not its last."""
    loaders: list = field(default_factory=list)
    """The prepared DataLoaders being iterated, innermost last."""

    @property
    def active_dataloader(self):
        return self.loaders[-1] if self.loaders else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self.loaders)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the batch in hand is the last of the innermost prepared DataLoader."""
        return bool(self.loaders) and self.loaders[-1].end_of_dataloader

    @property
    def real_samples(self) -> int | None:
        """How many samples of the current batch are real (not repeats completing the last global batch)."""
        return self.loaders[-1].real_samples if self.loaders else None


class AcceleratedOptimizer(torch.optim.Optimizer):
    # Subclasses Optimizer (without its __init__) only so LR schedulers accept it, as Accelerate's does.
    def __init__(self, optimizer: torch.optim.Optimizer, state: SharedState, scaler=None, xla=None):
        self.optimizer = optimizer
        self.shared = state
        self.scaler = scaler
        self.xla = xla
        self._unscaled = False
        self._scale_before: torch.Tensor | None = None

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step() was skipped for inf/nan gradients. Reading it waits for the device."""
        if self.scaler is None or self._scale_before is None:
            return False
        # The scaler lowers its scale exactly when it found inf/nan gradients and skipped the step.
        return bool(self.scaler._get_scale_async() < self._scale_before)

    def unscale_gradients(self) -> None:
        """Divide the gradients by the loss scale (once per step), so clipping and norms see the real values."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self, closure=None) -> None:
        if not self.shared.sync_gradients:
            return  # a micro-step inside an accumulation cycle: gradients keep adding up
        if self.scaler is not None:
            # Keep the scale as a device tensor: get_scale() returns a float, which waits for the GPU.
            self._scale_before = self.scaler._get_scale_async().clone()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._unscaled = False
        elif self.xla is not None:
            self.xla.optimizer_step(self.optimizer)
        else:
            self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.shared.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, value):
        self.optimizer.state = value

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value):
        self.optimizer.defaults = value

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def unwrap_optimizer(optimizer):
    """The torch optimizer inside an AcceleratedOptimizer (or the optimizer itself; None stays None)."""
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


class AcceleratedScheduler:
    """Steps the schedule with each optimizer step that really happened, `steps` times.

    `steps` is Accelerate's convention: a schedule written for one process, whose batches N processes now draw N
    at a time, steps N times per optimizer step (once when the batches are split: then a step covers the same
    samples as before). The runner's own loop counts optimizer steps of the global batch, so it splits."""

    def __init__(self, scheduler, state: SharedState, optimizers: list, steps: int = 1):
        self.scheduler = scheduler
        self.shared = state
        self.optimizers = optimizers
        self.steps = steps

    def step(self, *args, **kwargs) -> None:
        if not self.shared.sync_gradients or any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        for _ in range(self.steps):
            # OneCycleLR raises past its total_steps, which N steps per step reach early when drop_last is off.
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler._step_count > total:
                return
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def __getattr__(self, name: str):
        return getattr(self.scheduler, name)


class DeviceBatches:
    """Moves each batch (a tensor, or a dict/list/tuple of them) to the device as it is drawn."""

    def __init__(self, batches, device: torch.device):
        self.batches = batches
        self.device = device

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int, *args) -> None:
        # *args: whatever else the batch source's set_epoch takes (e.g. where in the epoch to resume).
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch, *args)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            yield tree_map(lambda tensor: tensor.to(self.device, non_blocking=True), batch)

    def stand_in(self) -> Any:
        return tree_map(lambda tensor: tensor.to(self.device), self.batches.stand_in())


def tree_map(fn, obj: Any) -> Any:
    """Apply fn to every tensor in a batch: a tensor, or any nesting of dicts, lists, tuples, namedtuples and
    dataclasses of them (torch's pytree walks the containers; a dataclass is rebuilt field by field). Other leaves
    (strings, numbers) are left alone."""
    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return fn(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changed = {f.name: tree_map(fn, getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            return dataclasses.replace(value, **changed)
        return value

    return pytree.tree_map(leaf, obj)
