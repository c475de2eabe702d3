"""Which device a hardware choice means on this machine, which GPUs a run may use, and whether this machine has them.

`gpu_ids` works through CUDA_VISIBLE_DEVICES, which CUDA reads once, when it initialises. So the parent selects the
GPUs (`select_gpus`, reading only the environment and NVML, never initialising CUDA) and exports the selection
(`apply_gpus`) before any `torch.cuda` call; workers inherit it and see the chosen GPUs as cuda:0, cuda:1, ...
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from runner import dist
from runner.config import HardwareKind
from runner.errors import HardwareError, Problem

log = logging.getLogger(__name__)

CUDA_KINDS = (HardwareKind.gpu, HardwareKind.multi_gpu)
MULTI_PROCESS_KINDS = (HardwareKind.multi_cpu, HardwareKind.multi_gpu)


def physical_gpu_count() -> int | None:
    """GPUs this torch can use on this machine, by NVML, which ignores CUDA_VISIBLE_DEVICES and does not initialise
    CUDA; 0 with a CPU-only torch build; None when NVML cannot be read (nothing can be said without CUDA)."""
    if torch.version.cuda is None and torch.version.hip is None:
        return 0
    try:
        count = torch.cuda._raw_device_count_nvml()
    except (OSError, AttributeError):
        return None
    return count if count >= 0 else None


def cuda_present() -> bool:
    """Whether this torch build can use a GPU here, asked without initialising CUDA when NVML allows it."""
    count = physical_gpu_count()
    return count > 0 if count is not None else torch.cuda.is_available()


def resolve_kind(kind: HardwareKind) -> HardwareKind:
    """`auto` becomes gpu when CUDA is present, else cpu."""
    if kind is HardwareKind.auto:
        return HardwareKind.gpu if cuda_present() else HardwareKind.cpu
    return kind


def parse_gpu_ids(value) -> list[int] | None:
    """`all`/None -> None (every GPU); 1, [0, 2], "0,2" -> [0, 2]. Raises ValueError saying what is accepted."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "")):
        return None
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    ids = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit():
            raise ValueError(
                f"{value!r} is not a GPU selection; use all, a list of GPU indices like [0,2], or a string like \"0,2\""
            )
        ids.append(int(text))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{value!r} names a GPU more than once; list each GPU index once")
    return ids


@dataclass
class GpuSelection:
    """The GPUs a run uses: their physical ids in rank order, the CUDA_VISIBLE_DEVICES to export, or problems."""

    physical: list[str] | None = None
    export: str | None = None
    problems: list[Problem] = field(default_factory=list)

    def table(self, num_processes: int) -> str:
        """Which physical GPU each local rank drives, e.g. `physical 2 -> rank 0 -> cuda:0`."""
        physical = self.physical or [str(index) for index in range(num_processes)]
        rows = [f"  physical {physical[rank]} -> rank {rank} -> cuda:{rank}" for rank in range(min(num_processes, len(physical)))]
        return "\n".join(["GPU assignment (physical id -> local rank -> device):", *rows])


def select_gpus(kind: HardwareKind, gpu_ids, num_processes: int) -> GpuSelection:
    """Which GPUs `gpu_ids` means here, checked against CUDA_VISIBLE_DEVICES and the GPUs present."""
    try:
        ids = parse_gpu_ids(gpu_ids)
    except ValueError as err:
        return GpuSelection(problems=[Problem("gpu_ids", str(err))])
    if resolve_kind(kind) not in CUDA_KINDS:
        return GpuSelection()
    inherited = dist.cuda_visible_devices()
    if inherited is not None:
        selection = _within_inherited(ids, inherited)
    elif ids is not None:
        selection = _on_machine(ids, physical_gpu_count())
    else:
        count = physical_gpu_count()
        selection = GpuSelection(physical=[str(index) for index in range(count)] if count else None)
    processes = num_processes if resolve_kind(kind) is HardwareKind.multi_gpu else 1
    if not selection.problems and selection.physical is not None:
        selection.problems += _count_problems(kind, ids, selection.physical, processes)
    return selection


def _count_problems(kind: HardwareKind, ids, physical: list[str], processes: int) -> list[Problem]:
    """One GPU per process: an explicit selection must match the process count, and there must be enough GPUs."""
    if ids is not None and len(ids) != processes:
        fix = (f"set hardware.num_processes={len(ids)}" if kind is HardwareKind.multi_gpu
               else f"use hardware=multi_gpu hardware.num_processes={len(ids)}, or give gpu_ids one GPU")
        return [Problem("gpu_ids", f"selects {len(ids)} GPU(s) ({','.join(map(str, ids))}) for {processes} process(es), one GPU each; {fix}")]
    if ids is None and processes > len(physical):
        return [
            Problem(
                "hardware.num_processes",
                f"is {processes}, one GPU each, but only {len(physical)} GPU(s) are available ({','.join(physical)}); "
                f"set hardware.num_processes={len(physical)} or fewer",
            )
        ]
    return []


def _within_inherited(ids: list[int] | None, inherited: str) -> GpuSelection:
    """CUDA_VISIBLE_DEVICES set by the user or a scheduler is respected: gpu_ids may narrow it, never widen it."""
    visible = [token.strip() for token in inherited.split(",") if token.strip()]
    if ids is None:
        return GpuSelection(physical=visible)
    if all(token.isdigit() for token in visible) and set(ids) <= {int(token) for token in visible}:
        return GpuSelection(physical=[str(i) for i in ids], export=",".join(map(str, ids)))
    return GpuSelection(
        problems=[
            Problem(
                "gpu_ids",
                f"[{','.join(map(str, ids))}] conflicts with CUDA_VISIBLE_DEVICES={inherited!r}, set before the run "
                "(by you or a scheduler such as SLURM); pick gpu_ids among those GPUs, drop gpu_ids to use them all, "
                "or unset CUDA_VISIBLE_DEVICES",
            )
        ]
    )


def _on_machine(ids: list[int], count: int | None) -> GpuSelection:
    if count is not None and any(index >= count for index in ids):
        present = ", ".join(map(str, range(count))) if count else "none"
        return GpuSelection(
            problems=[
                Problem(
                    "gpu_ids",
                    f"[{','.join(map(str, ids))}] names GPUs this machine does not have; it has {count} "
                    f"GPU(s): {present} (run `python -m runner.env` or nvidia-smi to list them)",
                )
            ]
        )
    return GpuSelection(physical=[str(i) for i in ids], export=",".join(map(str, ids)))


def apply_gpus(selection: GpuSelection) -> None:
    """Export the selection as CUDA_VISIBLE_DEVICES: before anything initialises CUDA, so this process and every
    worker it starts see exactly the chosen GPUs. A selection with problems changes nothing."""
    if not selection.problems and selection.export is not None:
        dist.set_cuda_visible_devices(selection.export)


def device_for(kind: HardwareKind, info: dist.DistInfo) -> torch.device:
    resolved = resolve_kind(kind)
    if kind is HardwareKind.auto:
        log.info("hardware=auto: %s", "CUDA is present, using the GPU" if resolved is HardwareKind.gpu else "no CUDA GPU, using the CPU")
    if resolved in CUDA_KINDS:
        count = torch.cuda.device_count()
        if info.local_rank >= count:
            raise HardwareError(
                f"hardware={kind.value}: local rank {info.local_rank} needs cuda:{info.local_rank}, but this process "
                f"sees {count} GPU(s) (CUDA_VISIBLE_DEVICES={dist.cuda_visible_devices()!r}); start at most {count} "
                "process(es) per machine or select more GPUs with gpu_ids"
            )
        return torch.device("cuda", info.local_rank)
    if resolved is HardwareKind.tpu:
        from runner.xla import Xla

        return Xla().device()
    return torch.device("cpu")


def hardware_problems(kind: HardwareKind, num_processes: int = 1) -> list[Problem]:
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
    if kind is HardwareKind.tpu:
        from runner.xla import xla_problem

        problem = xla_problem()
        problems = [Problem("hardware", problem)] if problem else []
        if num_processes > 1:
            problems.append(
                Problem("hardware.num_processes", f"is {num_processes}; hardware=tpu drives one XLA device per run, set 1")
            )
        return problems
    return []
