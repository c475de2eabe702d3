"""Hardware: `hardware` + `gpu_ids` + the environment -> one resolved description of where a run executes.

The parent resolves it once (`resolve_hardware`) and everything below reads the result: the checks, the launcher,
the workers and the Accelerator. Nothing else interprets a hardware kind; a new kind is an Enum value in
runner/config/schema.py, a YAML file in conf/hardware/ and one row of KINDS below.

`gpu_ids` works through CUDA_VISIBLE_DEVICES, which CUDA reads once, when it initialises. So the GPUs are chosen
from the environment and NVML alone (never initialising CUDA) and exported (`Hardware.apply`) before any
`torch.cuda` call; workers inherit the selection and see the chosen GPUs as cuda:0, cuda:1, ...
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field

import torch

from runner.distributed import dist
from runner.config import HardwareConfig, HardwareKind, StartMethod
from runner.errors import ConfigError, HardwareError, Problem

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the torch_xla build that matches your torch (pip install 'torch_xla[tpu]==<your torch version>'; "
    "note: none exists for torch 2.13 yet, the newest is 2.9), or use hardware=cpu, hardware=gpu or hardware=auto"
)


def xla_problem() -> str | None:
    """Why torch_xla cannot be used here, or None when it imports."""
    try:
        importlib.import_module("torch_xla")
    except ImportError as err:
        reason = "is not installed" if getattr(err, "name", None) == "torch_xla" else f"fails to import ({err})"
        return f"tpu needs torch_xla, which {reason}; {INSTALL_HINT}"
    return None


@dataclass(frozen=True)
class Kind:
    """What a hardware kind means: its torch device type, and whether the runner starts several processes."""

    device_type: str
    several_processes: bool
    default_processes: int | None = 1
    """Workers per machine when hardware.num_processes is null (None: one per selected GPU)."""


KINDS = {
    HardwareKind.cpu: Kind("cpu", False),
    HardwareKind.gpu: Kind("cuda", False),
    HardwareKind.multi_cpu: Kind("cpu", True, default_processes=2),
    HardwareKind.multi_gpu: Kind("cuda", True, default_processes=None),
    HardwareKind.tpu: Kind("xla", False),
}
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xla": None}  # torch.distributed backend per device type


@dataclass(frozen=True)
class Hardware:
    """Where one run executes, resolved once in the parent and handed to every worker (picklable)."""

    kind: HardwareKind
    """The chosen kind, `auto` already resolved to cpu or gpu."""
    device_type: str
    """cpu, cuda or xla."""
    processes_per_machine: int
    num_machines: int = 1
    machine_rank: int = 0
    physical_gpus: tuple[str, ...] = ()
    """The GPUs this machine's local ranks drive, in local-rank order (physical ids as the machine names them)."""
    cuda_visible_devices: str | None = None
    """What to export as CUDA_VISIBLE_DEVICES before CUDA starts (None: leave the environment as it is)."""
    external_launcher: bool = False
    """torchrun or SLURM started one process per rank already: the runner starts none."""
    start_method: StartMethod = StartMethod.spawn
    """Never auto: resolve_hardware picks fork or spawn for the device."""
    threads_per_process: int | None = None
    timeout_s: int = 600
    shutdown_timeout_s: int = 10
    max_restarts: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    problems: tuple[Problem, ...] = field(default=(), compare=False)
    """What stands in the way on this machine (reported by the checks, all at once)."""

    @property
    def world_size(self) -> int:
        return self.processes_per_machine * self.num_machines

    @property
    def multi_process(self) -> bool:
        return self.world_size > 1

    @property
    def launches_processes(self) -> bool:
        """The runner itself starts this machine's workers (through torch's elastic launcher)."""
        return KINDS[self.kind].several_processes and self.multi_process and not self.external_launcher

    @property
    def backend(self) -> str | None:
        return BACKENDS[self.device_type]

    def apply(self) -> None:
        """Export the GPU selection, before anything initialises CUDA, so this process and every worker it
        starts see exactly the chosen GPUs."""
        if self.cuda_visible_devices is not None:
            dist.set_cuda_visible_devices(self.cuda_visible_devices)

    def device(self, local_rank: int, xla=None) -> torch.device:
        """This process's device (the XLA one comes from torch_xla: pass the Accelerator's runner.accelerate.xla.Xla)."""
        if self.device_type == "cuda":
            count = torch.cuda.device_count()
            if local_rank >= count:
                raise HardwareError(
                    f"hardware={self.kind.value}: local rank {local_rank} needs cuda:{local_rank}, but this process "
                    f"sees {count} GPU(s) (CUDA_VISIBLE_DEVICES={dist.cuda_visible_devices()!r}); start at most "
                    f"{count} process(es) per machine or select more GPUs with gpu_ids"
                )
            return torch.device("cuda", local_rank)
        if self.device_type == "xla":
            return xla.device()
        return torch.device("cpu")

    def gpu_table(self) -> str:
        """Which physical GPU each local rank drives, e.g. `physical 2 -> rank 0 -> cuda:0`."""
        rows = [f"  physical {gpu} -> rank {rank} -> cuda:{rank}"
                for rank, gpu in enumerate(self.physical_gpus[: self.processes_per_machine])]
        return "\n".join(["GPU assignment (physical id -> local rank -> device):", *rows])


def _start_method(asked: StartMethod, device_type: str) -> StartMethod:
    """auto: fork where it is safe and fast (CPU workers on Linux: the launcher has not started CUDA, and a forked
    worker inherits the imports instead of repeating them, seconds on 2 cores; benchmarks/distributed.py), spawn
    elsewhere (CUDA cannot survive a fork; macOS system libraries are not fork-safe)."""
    if asked is not StartMethod.auto:
        return asked
    return StartMethod.fork if device_type == "cpu" and sys.platform.startswith("linux") else StartMethod.spawn


def resolve_hardware(settings: HardwareConfig, gpu_ids=None) -> Hardware:
    """The Hardware this machine offers for these settings; what does not fit is listed in `.problems`."""
    kind = _resolve_kind(settings.kind)
    meaning = KINDS[kind]
    external = dist.started_by_external_launcher()
    selection = _select_gpus(meaning.device_type, gpu_ids)
    if external:  # torchrun / SLURM decided the process counts
        info = dist.DistInfo.from_env()
        processes, machines = info.local_world_size, max(1, info.world_size // max(1, info.local_world_size))
    else:
        processes = settings.num_processes or meaning.default_processes or max(1, len(selection.physical or ()))
        machines = settings.num_machines
    problems = list(selection.problems)
    if external and settings.num_processes is not None and settings.num_processes != processes:
        # As documented: under torchrun the key is ignored (hardware=multi_cpu sets 2, torchrun may start 1 a node).
        log.info("hardware.num_processes=%d is ignored: the launcher (torchrun or srun) started %d process(es) on "
                 "this machine", settings.num_processes, processes)
    if not problems and selection.physical is not None and meaning.device_type == "cuda":
        problems += _count_problems(kind, gpu_ids, selection.physical, processes if meaning.several_processes else 1)
    hardware = Hardware(
        kind=kind, device_type=meaning.device_type, processes_per_machine=processes, num_machines=machines,
        machine_rank=settings.machine_rank, physical_gpus=tuple(selection.physical or ()),
        cuda_visible_devices=selection.export, external_launcher=external,
        start_method=_start_method(settings.start_method, meaning.device_type),
        threads_per_process=settings.threads_per_process, timeout_s=settings.timeout_s,
        shutdown_timeout_s=settings.shutdown_timeout_s, max_restarts=settings.max_restarts,
        main_process_ip=settings.main_process_ip,
        main_process_port=settings.main_process_port,
    )
    return _with_problems(hardware, problems + _presence_problems(hardware, settings))


def this_process() -> Hardware:
    """What a hand-written loop's Accelerator runs on when told nothing: this process's CUDA GPU when CUDA is
    present, else the CPU; the process counts of the launcher that started it (torchrun, SLURM, runner.launch)."""
    info = dist.DistInfo.from_env()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    kind = HardwareKind.gpu if device_type == "cuda" else HardwareKind.cpu
    return Hardware(kind=kind, device_type=device_type, processes_per_machine=info.local_world_size,
                    num_machines=max(1, info.world_size // max(1, info.local_world_size)),
                    external_launcher=info.is_distributed)


def for_device(device: torch.device | str) -> Hardware:
    """The Hardware of an Accelerator given an explicit device (`Accelerator("cpu")`), with this process's counts: a
    device torch knows, and for CUDA one this torch can use (else it failed only at prepare())."""
    try:
        device_type = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ConfigError(Problem("Accelerator(device)", (
            f"is {device!r}, which torch does not know as a device; give 'cpu', 'cuda', 'cuda:N' or 'xla'"))) from None
    if device_type == "cuda" and not torch.cuda.is_available():
        raise HardwareError(f"Accelerator(device={device!r}): this torch cannot use a CUDA GPU here "
                            f"({'no GPU found' if torch.version.cuda or torch.version.hip else 'a CPU-only build'}); "
                            "give 'cpu'")
    detected = this_process()
    kind = {"cuda": HardwareKind.gpu, "xla": HardwareKind.tpu}.get(device_type, HardwareKind.cpu)
    return Hardware(kind=kind, device_type=device_type, processes_per_machine=detected.processes_per_machine,
                    num_machines=detected.num_machines, external_launcher=detected.external_launcher)


def _with_problems(hardware: Hardware, problems: list[Problem]) -> Hardware:
    from dataclasses import replace

    return replace(hardware, problems=tuple(problems))


# -- GPUs present and selected ------------------------------------------------------------------------------------


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


def _resolve_kind(kind: HardwareKind) -> HardwareKind:
    """`auto` becomes gpu when CUDA is present, else cpu (and says which)."""
    if kind is not HardwareKind.auto:
        return kind
    resolved = HardwareKind.gpu if cuda_present() else HardwareKind.cpu
    log.info("hardware=auto: %s", "CUDA is present, using the GPU" if resolved is HardwareKind.gpu
             else "no CUDA GPU, using the CPU")
    return resolved


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
class _Selection:
    physical: list[str] | None = None
    export: str | None = None
    problems: list[Problem] = field(default_factory=list)


def _select_gpus(device_type: str, gpu_ids) -> _Selection:
    """Which GPUs `gpu_ids` means here, checked against CUDA_VISIBLE_DEVICES and the GPUs present."""
    try:
        ids = parse_gpu_ids(gpu_ids)
    except ValueError as err:
        return _Selection(problems=[Problem("gpu_ids", str(err))])
    if device_type != "cuda":
        if ids is not None:  # often this machine's default (runner machine set gpu_ids=...): said, not refused
            log.warning("gpu_ids=%s is not used: this run's hardware runs on the %s, not on GPUs", gpu_ids,
                        device_type.upper())
        return _Selection()
    inherited = dist.cuda_visible_devices()
    if inherited is not None:
        return _within_inherited(ids, inherited)
    if ids is not None:
        return _on_machine(ids, physical_gpu_count())
    count = physical_gpu_count()
    return _Selection(physical=[str(index) for index in range(count)] if count else None)


def _count_problems(kind: HardwareKind, ids, physical: list[str], processes: int) -> list[Problem]:
    """One GPU per process: an explicit selection must match the process count, and there must be enough GPUs."""
    ids = parse_gpu_ids(ids)
    if ids is not None and len(ids) != processes:
        fix = (f"set hardware.num_processes={len(ids)}" if KINDS[kind].several_processes
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


def _within_inherited(ids: list[int] | None, inherited: str) -> _Selection:
    """CUDA_VISIBLE_DEVICES set by the user or a scheduler is respected: gpu_ids may narrow it, never widen it."""
    visible = [token.strip() for token in inherited.split(",") if token.strip()]
    if ids is None:
        return _Selection(physical=visible)
    if all(token.isdigit() for token in visible) and set(ids) <= {int(token) for token in visible}:
        return _Selection(physical=[str(i) for i in ids], export=",".join(map(str, ids)))
    return _Selection(
        problems=[
            Problem(
                "gpu_ids",
                f"[{','.join(map(str, ids))}] conflicts with CUDA_VISIBLE_DEVICES={inherited!r}, set before the run "
                "(by you or a scheduler such as SLURM); pick gpu_ids among those GPUs, drop gpu_ids to use them all, "
                "or unset CUDA_VISIBLE_DEVICES",
            )
        ]
    )


def _on_machine(ids: list[int], count: int | None) -> _Selection:
    if count is not None and any(index >= count for index in ids):
        present = ", ".join(map(str, range(count))) if count else "none"
        return _Selection(
            problems=[
                Problem(
                    "gpu_ids",
                    f"[{','.join(map(str, ids))}] names GPUs this machine does not have; it has {count} "
                    f"GPU(s): {present} (run `python -m runner env` or nvidia-smi to list them)",
                )
            ]
        )
    return _Selection(physical=[str(i) for i in ids], export=",".join(map(str, ids)))


def _presence_problems(hardware: Hardware, settings: HardwareConfig) -> list[Problem]:
    """What this machine lacks for the chosen hardware."""
    if hardware.device_type == "cuda" and not torch.cuda.is_available():
        return [
            Problem(
                "hardware",
                f"{hardware.kind.value} needs a CUDA GPU, but torch {torch.__version__} sees none on this machine "
                "(torch.cuda.is_available() is False); use hardware=cpu, hardware=multi_cpu or hardware=auto, "
                "or install a CUDA build of torch on a machine with a GPU",
            )
        ]
    if hardware.device_type == "xla":
        problem = xla_problem()
        problems = [Problem("hardware", problem)] if problem else []
        if hardware.processes_per_machine > 1:
            problems.append(Problem("hardware.num_processes", f"is {hardware.processes_per_machine}; hardware=tpu "
                                                              "drives one XLA device per run, set 1"))
        return problems
    return []


def memory_per_process(hardware: Hardware) -> int | None:
    """Bytes one process may fill: a GPU's memory (the smallest of those visible), or on a CPU this machine's RAM
    shared by its processes; None where it is not known here (a TPU)."""
    if hardware.device_type == "cuda":
        if not torch.cuda.is_available():
            return None
        return min(torch.cuda.get_device_properties(index).total_memory for index in range(torch.cuda.device_count()))
    if hardware.device_type == "cpu":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // hardware.processes_per_machine
    return None
