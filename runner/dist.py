"""The only reader of RANK / LOCAL_RANK / WORLD_SIZE and the owner of process-group state."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


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
