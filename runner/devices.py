"""Which device a hardware choice means on this machine, and whether this machine has it."""

from __future__ import annotations

import importlib.util

import torch

from runner.config import HardwareKind
from runner.dist import DistInfo
from runner.errors import Problem

CUDA_KINDS = (HardwareKind.gpu, HardwareKind.multi_gpu)
MULTI_PROCESS_KINDS = (HardwareKind.multi_cpu, HardwareKind.multi_gpu)


def resolve_kind(kind: HardwareKind) -> HardwareKind:
    """`auto` becomes gpu when CUDA is present, else cpu."""
    if kind is HardwareKind.auto:
        return HardwareKind.gpu if torch.cuda.is_available() else HardwareKind.cpu
    return kind


def device_for(kind: HardwareKind, dist: DistInfo) -> torch.device:
    kind = resolve_kind(kind)
    if kind in CUDA_KINDS:
        return torch.device("cuda", dist.local_rank % max(1, torch.cuda.device_count()))
    if kind is HardwareKind.tpu:
        import torch_xla

        return torch_xla.device()
    return torch.device("cpu")


def hardware_problems(kind: HardwareKind) -> list[Problem]:
    """What this machine lacks for the chosen hardware."""
    if kind in CUDA_KINDS and not torch.cuda.is_available():
        return [
            Problem(
                "hardware",
                f"{kind.value} needs a CUDA GPU, but torch {torch.__version__} sees none on this machine "
                "(torch.cuda.is_available() is False); use hardware=cpu, hardware=multi_cpu or hardware=auto, "
                "or install a CUDA build of torch on a machine with a GPU",
            )
        ]
    if kind is HardwareKind.tpu and importlib.util.find_spec("torch_xla") is None:
        return [
            Problem(
                "hardware",
                "tpu needs torch_xla, which is not installed; install the torch_xla build matching your torch "
                "(note: none exists for torch 2.13 yet), or use hardware=cpu or hardware=auto",
            )
        ]
    return []
