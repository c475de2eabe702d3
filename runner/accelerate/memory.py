"""Memory one process holds for a model's weights, gradients and optimizer state under a parallel setting,
computed from the model built on the meta device (shapes and dtypes, no storage), for `runner plan`.

- ddp / one process: every process holds every parameter, its gradient and its optimizer state; DDP adds its
  gradient buckets (a copy of the gradients, unless parallel.gradient_as_bucket_view).
- fsdp on N processes: fully_shard splits each parameter along its first dimension into N chunks of
  ceil(rows / N) rows (torch.chunk's split, padded to equal size), and the gradient and the optimizer state of
  a parameter are shards of the same shape. While a unit computes its parameters are gathered whole, in the
  compute dtype: the model's own unit and up to two blocks at once (the one computing, the next prefetched).

Activations are not counted: they depend on the batch and on the model's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from runner.config import ParallelConfig, ParallelKind, PrecisionKind


@dataclass(frozen=True)
class MemoryPlan:
    parameters: int
    """Elements, a tied weight once."""
    weight_bytes: int
    """Per process, as are all the byte counts."""
    gradient_bytes: int
    optimizer_bytes: int
    bucket_bytes: int
    """DDP's gradient buckets (0 without DDP)."""
    gathered_bytes: int
    """FSDP: the most parameters gathered whole at once while computing (0 without FSDP)."""

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.gradient_bytes + self.optimizer_bytes + self.bucket_bytes + self.gathered_bytes


def memory_plan(model: nn.Module, optimizer: torch.optim.Optimizer, parallel: ParallelConfig, world_size: int,
                precision: PrecisionKind) -> MemoryPlan:
    """`model` on the meta device and `optimizer` built on its parameters (stepped here, on the meta device, to
    learn the shapes of its state)."""
    sharded = world_size > 1 and parallel.kind is ParallelKind.fsdp
    parameters = list(model.parameters())  # a tied weight once, as the optimizer sees it

    def held(tensor: torch.Tensor, shape: torch.Size) -> int:
        """Bytes one process holds of `tensor`, which is sharded like a parameter of `shape` when it has it."""
        if sharded and tensor.dim() and tensor.shape == shape:
            return math.ceil(shape[0] / world_size) * math.prod(shape[1:]) * tensor.element_size()
        return tensor.numel() * tensor.element_size()

    weights = sum(held(parameter, parameter.shape) for parameter in parameters)
    state = optimizer_state(optimizer, parameters)
    optimizer_bytes = sum(held(tensor, parameter.shape) for parameter in parameters for tensor in state[parameter])
    ddp = world_size > 1 and parallel.kind is ParallelKind.ddp
    return MemoryPlan(
        parameters=sum(parameter.numel() for parameter in parameters),
        weight_bytes=weights,
        gradient_bytes=weights,  # a gradient has its parameter's shape and dtype (FSDP reduces in fp32 too)
        optimizer_bytes=optimizer_bytes,
        bucket_bytes=weights if ddp and not parallel.gradient_as_bucket_view else 0,
        gathered_bytes=gathered_bytes(model, parallel, precision) if sharded else 0,
    )


def optimizer_state(optimizer: torch.optim.Optimizer, parameters: list[nn.Parameter]) -> dict:
    """parameter -> the tensors the optimizer keeps for it, from one step on the meta device (nothing is computed;
    torch's optimizers make their state on the parameters' device)."""
    for parameter in parameters:
        parameter.grad = torch.empty_like(parameter)
    optimizer.step()
    state = {parameter: [value for value in optimizer.state.get(parameter, {}).values() if torch.is_tensor(value)]
             for parameter in parameters}
    for parameter in parameters:
        parameter.grad = None
    return state


def gathered_bytes(model: nn.Module, parallel: ParallelConfig, precision: PrecisionKind) -> int:
    from runner.accelerate.parallel import FSDP_PRECISION, find_blocks

    blocks = find_blocks(model, parallel.shard_modules, "parallel.shard_modules", required=False)
    block_elements = [sum(parameter.numel() for parameter in block.parameters()) for _, _, block in blocks]
    own = sum(parameter.numel() for parameter in model.parameters()) - sum(block_elements)
    size = FSDP_PRECISION[precision][0].itemsize if precision in FSDP_PRECISION else 4
    return (own + 2 * max(block_elements, default=0)) * size


def human(size: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
