"""The SLURM sweep launcher's request, checked against the partition before anything is submitted.

`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml) derives each trial's CPUs, memory and GPUs from the
hardware group (`runner.slurm_request`). A request no node of the partition can meet does not fail in SLURM: the
array job pends forever while the sweep prints only submitit's accounting warnings. So the sweep asks `sinfo` and
`scontrol` first (a few seconds at most; skipped where they are absent) and refuses such a request in one paragraph
naming the request and the partition's limits. Plain Python, no Hydra: runner.sweep.callback calls it with plain values.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

from runner.errors import LaunchError

log = logging.getLogger("runner")

CPUS_PER_PROCESS = 2
"""CPUs asked per process when hardware.threads_per_process is null (the runner then uses what SLURM gives)."""
MEM_GB_PER_CPU = 4
SINFO_FORMAT = "%N|%P|%c|%m|%G|%l"
"""Node name, partition (`*` marks the default), CPUs, memory in MB, generic resources, the partition's time limit."""
QUERY_TIMEOUT_S = 10


def slurm_request(what: str, kind: Any, num_processes: Optional[int], threads_per_process: Optional[int]) -> Any:
    """`${runner.slurm_request:cpus|mem_gb|gpus,${hardware.kind},${hardware.num_processes},...}`: one trial's
    request as the hardware group implies it. cpus: processes x threads (threads_per_process, else
    CPUS_PER_PROCESS); mem_gb: MEM_GB_PER_CPU per CPU; gpus: one per process on gpu / multi_gpu, else None."""
    kind = str(getattr(kind, "value", kind))
    default = 2 if kind == "multi_cpu" else 1  # the schema's meaning of a null num_processes (multi_gpu: see below)
    processes = int(num_processes) if num_processes else default
    cpus = processes * int(threads_per_process or CPUS_PER_PROCESS)
    if what == "cpus":
        return cpus
    if what == "mem_gb":
        return cpus * MEM_GB_PER_CPU
    if what == "gpus":
        # multi_gpu with a null num_processes means "every visible GPU": unknowable before the job runs, so the
        # check asks for a number (launcher_problems) instead of guessing one here.
        if kind == "gpu":
            return 1
        return int(num_processes) if kind == "multi_gpu" and num_processes else None
    raise ValueError(f"runner.slurm_request: {what!r} is not cpus, mem_gb or gpus")


@dataclass(frozen=True)
class Request:
    """What each trial of the array asks SLURM for (the submitit launcher's settings)."""

    partition: Optional[str]
    nodes: int
    tasks_per_node: int
    cpus_per_task: Optional[int]
    mem_gb: Optional[int]
    gpus_per_node: Optional[int]
    timeout_min: int

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * (self.cpus_per_task or 1)

    def describe(self) -> str:
        parts = [f"{self.cpus_per_node} CPUs"]
        if self.mem_gb:
            parts.append(f"{self.mem_gb} GB")
        parts.append(f"{self.gpus_per_node} GPUs" if self.gpus_per_node else "no GPU")
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''}"
        return f"{nodes} with {', '.join(parts)} each, for {self.timeout_min} min"


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple
    time_limit_min: Optional[int]
    """None: infinite."""
    max_cpus_per_node: Optional[int] = None
    max_mem_per_node_mb: Optional[int] = None

    def describe(self) -> str:
        largest = (f"its nodes have at most {max(n.cpus for n in self.nodes)} CPUs, "
                   f"{max(n.memory_mb for n in self.nodes) // 1024} GB "
                   f"({max(n.memory_mb for n in self.nodes)} MB) and "
                   f"{_gpus(max(n.gpus for n in self.nodes))}") if self.nodes else "it lists no nodes"
        limits = [f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}", largest]
        if self.max_cpus_per_node is not None:
            limits.append(f"at most {self.max_cpus_per_node} CPUs per node for a job (MaxCPUsPerNode)")
        if self.max_mem_per_node_mb is not None:
            limits.append(f"at most {self.max_mem_per_node_mb} MB per node for a job (MaxMemPerNode)")
        limits.append("no time limit" if self.time_limit_min is None else f"a time limit of {self.time_limit_min} min")
        return f"partition {self.name} has " + "; ".join(limits)


def _gpus(count: int) -> str:
    return f"{count} GPUs" if count else "no GPU"


def parse_sinfo(text: str, partition: Optional[str]) -> Optional[Partition]:
    """`sinfo --noheader --Node --format SINFO_FORMAT` output -> the named partition (None: the default one, marked
    `*`), or None when it is not listed."""
    nodes: dict[str, Node] = {}
    name, time_limit = None, None
    for line in text.splitlines():
        cells = line.strip().split("|")
        if len(cells) != 6:
            continue
        node, part, cpus, memory, gres, limit = (cell.strip() for cell in cells)
        is_default = part.endswith("*")
        part = part.rstrip("*")
        if (partition is None and not is_default) or (partition is not None and part != partition):
            continue
        name, time_limit = part, parse_time_limit(limit)
        nodes[node] = Node(node, _int(cpus), _int(memory.rstrip("+")), parse_gpus(gres))
    if name is None:
        return None
    return Partition(name, tuple(nodes.values()), time_limit)


def parse_scontrol(text: str, partition: Partition) -> Partition:
    """`scontrol show partition NAME`: the per-job limits sinfo does not show (MaxCPUsPerNode, MaxMemPerNode)."""
    fields = dict(re.findall(r"(\w+)=(\S+)", text))
    max_cpus = fields.get("MaxCPUsPerNode", "UNLIMITED")
    max_mem = fields.get("MaxMemPerNode", "UNLIMITED")
    return Partition(partition.name, partition.nodes, partition.time_limit_min,
                     None if not max_cpus.isdigit() else int(max_cpus),
                     None if not max_mem.isdigit() else int(max_mem))


def parse_gpus(gres: str) -> int:
    """`gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,gpu:v100:2`, `(null)` -> GPUs on the node."""
    total = 0
    for item in gres.split(","):
        item = re.sub(r"\(.*?\)", "", item).strip()
        if item.startswith("gpu"):
            count = item.split(":")[-1]
            total += int(count) if count.isdigit() else 1
    return total


def parse_time_limit(text: str) -> Optional[int]:
    """SLURM's `[days-]hours:minutes:seconds`, `minutes:seconds`, `minutes` or `infinite` -> minutes (None)."""
    text = text.strip()
    if text in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


def _int(text: str) -> int:
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


def unmet(request: Request, partition: Partition) -> list[str]:
    """What of the request no node of the partition can give, one phrase each ([] when it fits)."""
    problems = []
    fitting = [node for node in partition.nodes if node.cpus >= request.cpus_per_node
               and node.memory_mb >= (request.mem_gb or 0) * 1024 and node.gpus >= (request.gpus_per_node or 0)]
    if len(fitting) < request.nodes:
        problems.append(f"{len(fitting)} of its nodes can hold {request.cpus_per_node} CPUs, {request.mem_gb or 0} GB "
                        f"and {_gpus(request.gpus_per_node or 0)} at once, and the trial needs {request.nodes}")
    if partition.max_cpus_per_node is not None and request.cpus_per_node > partition.max_cpus_per_node:
        problems.append(f"{request.cpus_per_node} CPUs per node is above its MaxCPUsPerNode")
    if partition.max_mem_per_node_mb is not None and (request.mem_gb or 0) * 1024 > partition.max_mem_per_node_mb:
        problems.append(f"{request.mem_gb} GB per node is above its MaxMemPerNode")
    if partition.time_limit_min is not None and request.timeout_min > partition.time_limit_min:
        problems.append(f"{request.timeout_min} min is above its time limit")
    return problems


def refusal(request: Request, partition: Partition, problems: list[str]) -> LaunchError:
    return LaunchError(
        f"hydra.launcher: SLURM cannot run these trials: each asks for {request.describe()}, and "
        f"{partition.describe()} (sinfo): {'; '.join(problems)}. Submitted, the array job would pend forever. Ask "
        "for less (the request follows hardware=... and hardware.num_processes / hardware.threads_per_process; "
        "or set hydra.launcher.cpus_per_task, mem_gb, gpus_per_node, timeout_min), or pick a partition that has "
        "it with hydra.launcher.partition=NAME (`sinfo` lists them)."
    )


def check_partition(request: Request, run=subprocess.run) -> Optional[Partition]:
    """Refuse a request the partition cannot meet (LaunchError); None when sinfo is absent or does not answer
    in time, so the check never stops a sweep it cannot judge. `run`: subprocess.run (tests pass recorded output)."""
    if run is subprocess.run and shutil.which("sinfo") is None:
        log.info("sinfo not found: the SLURM request (%s) is not checked against the partition", request.describe())
        return None
    command = ["sinfo", "--noheader", "--Node", "--format", SINFO_FORMAT]
    if request.partition:
        command += ["--partition", request.partition]
    try:
        answer = run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("sinfo did not answer (%s): the SLURM request is not checked against the partition", err)
        return None
    partition = parse_sinfo(answer.stdout, request.partition)
    if partition is None:
        where = f"partition {request.partition}" if request.partition else "a default partition"
        raise LaunchError(f"hydra.launcher.partition: sinfo lists no {where}; the partitions are "
                          f"{', '.join(_partition_names(answer.stdout)) or 'none'} (set hydra.launcher.partition=NAME)")
    try:
        shown = run(["scontrol", "show", "partition", partition.name], capture_output=True, text=True,
                    timeout=QUERY_TIMEOUT_S)
        partition = parse_scontrol(shown.stdout, partition)
    except (OSError, subprocess.TimeoutExpired):
        pass  # sinfo's node sizes and time limit are the main part of the check
    problems = unmet(request, partition)
    if problems:
        raise refusal(request, partition, problems)
    return partition


def _partition_names(sinfo_text: str) -> list[str]:
    names = []
    for line in sinfo_text.splitlines():
        cells = line.split("|")
        if len(cells) == 6 and cells[1].strip() not in names:
            names.append(cells[1].strip())
    return names


def layout_problem(tasks_per_node: int, nodes: int, num_machines: Any) -> Optional[str]:
    """Several tasks or nodes per trial under the sweep's SLURM launcher: each task runs the whole job on its own
    (the runner starts a trial's ranks itself), so they would not form one group; the refusal says what does."""
    if tasks_per_node > 1:
        return (f"hydra.launcher.tasks_per_node is {tasks_per_node}, but each task of a trial would run the whole "
                "trial on its own (the runner starts a trial's ranks itself): one would train and the others be "
                "refused. Keep tasks_per_node=1 and ask for the ranks with the hardware group, e.g. hardware=multi_gpu "
                f"hardware.num_processes={tasks_per_node} (the request follows: {tasks_per_node} GPUs per trial); for "
                f"one SLURM task per rank, submit an sbatch script that runs `srun -n {tasks_per_node} python -m runner "
                "...` (or `srun runner launch ...` for your own script) instead of a sweep launcher.")
    if nodes > 1 and str(num_machines) in ("1", "None"):
        return (f"hydra.launcher.nodes is {nodes}, but hardware.num_machines is {num_machines}: each node would train "
                "the whole trial on its own. Add the multi-machine overrides that read SLURM's variables in the job "
                "('hardware.num_machines=${oc.env:SLURM_NNODES}' 'hardware.machine_rank=${oc.env:SLURM_NODEID}' "
                "'hardware.main_process_ip=${oc.env:SLURM_LAUNCH_NODE_IPADDR}' hardware.main_process_port=29500, "
                "docs/distributed.md: SLURM, one task per node), or keep hydra.launcher.nodes=1.")
    return None
