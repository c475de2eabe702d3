"""The only reader of RANK / LOCAL_RANK / WORLD_SIZE and the owner of process-group state."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


REDUCE_OPS = {"sum": torch_dist.ReduceOp.SUM, "max": torch_dist.ReduceOp.MAX, "min": torch_dist.ReduceOp.MIN}


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the run. A single-process run is rank 0 of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> "DistInfo":
        """Read what torchrun / the elastic launcher / SLURM-via-torchrun set; defaults to a single process."""
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


def init_process_group(info: DistInfo, device_type: str) -> None:
    """Join the group once (gloo on CPU, nccl on CUDA); a group that already exists is kept, as under torchrun."""
    if info.is_distributed and not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if device_type == "cuda" else "gloo")


def destroy_process_group() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def barrier() -> None:
    if torch_dist.is_initialized():
        torch_dist.barrier()


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce a tensor over all processes in place: "sum", "mean", "max" or "min" (a no-op in a single process)."""
    if not torch_dist.is_initialized():
        return tensor
    if op == "mean":
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor.div_(torch_dist.get_world_size())
    torch_dist.all_reduce(tensor, op=REDUCE_OPS[op])
    return tensor


def all_gather_cat(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's tensor concatenated along dim 0, in rank order; first dims may differ between processes."""
    if not torch_dist.is_initialized():
        return tensor
    world = torch_dist.get_world_size()
    tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor
    # all_gather needs equal shapes: share the lengths, pad to the longest, then drop each process's padding.
    length = torch.tensor([tensor.shape[0]], device=tensor.device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    torch_dist.all_gather(lengths, length)
    lengths = [int(n.item()) for n in lengths]
    padded = tensor.new_zeros((max(lengths), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    torch_dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, lengths)])


def cuda_visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as the user, a scheduler (SLURM) or an earlier `apply` left it; None when unset."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def set_cuda_visible_devices(value: str) -> None:
    """Export CUDA_VISIBLE_DEVICES: effective only before CUDA initialises; inherited by spawned workers."""
    os.environ["CUDA_VISIBLE_DEVICES"] = value


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (in place; a no-op in a single process)."""
    if torch_dist.is_initialized():
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj) -> list:
    """Every process's `obj` (small picklable values, e.g. RNG states), in rank order; [obj] in one process."""
    if not torch_dist.is_initialized():
        return [obj]
    gathered = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, obj)
    return gathered
