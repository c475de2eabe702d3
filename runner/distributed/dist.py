"""The only reader of RANK / LOCAL_RANK / WORLD_SIZE and the owner of process-group state."""

from __future__ import annotations

import atexit
import difflib
import hashlib
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as torch_dist

from runner.ground import flatten

# Keys that legitimately differ between machines of one run, left out of the consistency hash.
MACHINE_LOCAL_KEYS = (("hardware", "machine_rank"),)


REDUCE_OPS = {"sum": torch_dist.ReduceOp.SUM, "max": torch_dist.ReduceOp.MAX, "min": torch_dist.ReduceOp.MIN}


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the run. A single-process run is rank 0 of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @classmethod
    def from_env(cls) -> "DistInfo":
        """Read what torchrun / the elastic launcher / SLURM-via-torchrun set; defaults to a single process."""
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            world_size=world_size,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def started_by_external_launcher() -> bool:
    """torchrun (or srun, see adopt_slurm_tasks) already started one process per rank: the runner starts none."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ


def adopt_slurm_tasks() -> bool:
    """Tasks that srun started (`srun -n 2 python -m runner ...`, submitit with tasks_per_node > 1) are the ranks:
    give them the variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) from SLURM's own, so everything after reads one convention. A no-op under torchrun, outside
    SLURM, and for a single task (a job script that runs the runner once and lets it start its own processes)."""
    env = os.environ
    if "RANK" in env or "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return False
    world = int(env["SLURM_NTASKS"])
    nodes = max(1, int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1"))))
    env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], str(world)
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["LOCAL_WORLD_SIZE"] = str(_tasks_on_this_node(env.get("SLURM_TASKS_PER_NODE"), world // nodes))
    env.setdefault("MASTER_ADDR", first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                             or "localhost"))
    # The same port on every task without talking first: derived from the job (and step), in the ephemeral-free
    # range; set MASTER_PORT to choose it.
    job = int(env.get("SLURM_JOB_ID", "0")) * 8 + int(env.get("SLURM_STEP_ID", "0") or 0)
    env.setdefault("MASTER_PORT", str(20000 + job % 20000))
    return True


def _slurm_step_id() -> str | None:
    env = os.environ
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 and "TORCHELASTIC_RUN_ID" not in env:
        return f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    return None


def _tasks_on_this_node(tasks_per_node: str | None, default: int) -> int:
    """SLURM_TASKS_PER_NODE as SLURM writes it ("2", "2(x3)", "3,2"): the first node's count."""
    if not tasks_per_node:
        return max(1, default)
    return int(tasks_per_node.split(",")[0].split("(")[0])


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list ("node[03-05,09]" -> "node03", "a,b" -> "a"): rank 0's node."""
    import re

    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if head is None:
        return nodelist
    name, ranges = head.group(1), head.group(2)
    if not ranges:
        return name
    return name + ranges.split(",")[0].split("-")[0]


def restart_count() -> int:
    """How often the elastic agent (torchrun --max-restarts, hardware.max_restarts) restarted this group."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def requeued_by_submitit() -> bool:
    """A submitit job (hydra/launcher=slurm) that SLURM starts again after submitit requeued it: its trial
    continues from its newest checkpoint, as a group torchrun restarted does."""
    return "SUBMITIT_EXECUTOR" in os.environ and int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0


def external_rank() -> int | None:
    """The RANK a launcher outside this program (torchrun, SLURM via torchrun) gave this process, if any."""
    return int(os.environ["RANK"]) if "RANK" in os.environ else None


def writes_run_dir(machine_rank: int) -> bool:
    """Whether this process owns the run dir's run-level files (config.yaml, the lock, result.json): the launching
    process of machine 0, or global rank 0 of a run torchrun started."""
    rank = external_rank()
    return machine_rank == 0 and rank in (None, 0)


def external_run_id() -> str | None:
    """An id shared by every rank of one job, or None when nothing outside the runner started this process: the
    engine's job id (see `detect_engine`), else, under torchrun with no id of its own, its agent's.

    torchrun's TORCHELASTIC_RUN_ID is a fresh uuid with --standalone or a single-node default rendezvous, but the
    literal "none" when --rdzv-id is not given otherwise (e.g. --master-port, several nodes): then the ranks'
    common parent, torchrun's agent, tells launches apart on one machine."""
    engine = detect_engine()
    if engine.job_id is not None:
        return engine.job_id
    if engine.name == "torchrun":
        return f"torchrun-{time.strftime('%Y%m%d')}-{socket.gethostname()}-{os.getppid()}"
    return None


RUNNER_RUN_ID = "runner"
"""The rendezvous id of the runner's own launcher (its workers see it as TORCHELASTIC_RUN_ID): `runner` for several
machines, `runner-<8 hex>` for one. Its workers were started by the runner, not by a torchrun of the user's."""


def is_runner_run_id(run_id: str) -> bool:
    return run_id == RUNNER_RUN_ID or (run_id.startswith(RUNNER_RUN_ID + "-") and len(run_id) == len(RUNNER_RUN_ID) + 9)


# --- who started this process ----------------------------------------------------------------------------------------

ENGINE_ORDER = ("torchrun", "slurm", "ray", "kubeflow", "skypilot")
"""The engines read from the environment, first match wins. Keys given in the config come before all of them
(`skypilot_machine_overrides` adds only what the command line does not set)."""


@dataclass(frozen=True)
class Engine:
    """What started this process, as its environment says. `name`: one of ENGINE_ORDER, or "none" (a person, or the
    runner's own launcher); `job_id`: shared by every process of the job and kept across its restarts (the run
    dir's name), None where the engine gives none; `nodes`, `node_rank`: the machines the engine gave the job and
    this one's index, None where it does not say."""

    name: str
    job_id: str | None = None
    nodes: int | None = None
    node_rank: int | None = None


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def detect_engine(env: dict | None = None) -> Engine:
    """The engine that started this process, in the fixed order of ENGINE_ORDER. Under torchrun the scheduler
    around it (Kubeflow's PET_* variables, SkyPilot's, a SLURM step of srun tasks) still names the job, so every
    machine of one job agrees on its id and a restarted pod or node finds the same run dir."""
    env = os.environ if env is None else env
    kubeflow = env.get("PET_MASTER_ADDR") and env.get("PET_NNODES")
    skypilot = "SKYPILOT_NODE_RANK" in env and "SKYPILOT_NODE_IPS" in env
    if kubeflow:  # Kubeflow Trainer derives the master's address from the TrainJob's name; the port tells runs apart
        job = f"kubeflow-{env['PET_MASTER_ADDR']}-{env.get('PET_MASTER_PORT', '')}".rstrip("-")
        nodes, node_rank = _number(env.get("PET_NNODES")), _number(env.get("PET_NODE_RANK"))
    elif skypilot:
        job = f"skypilot-{env['SKYPILOT_TASK_ID']}" if env.get("SKYPILOT_TASK_ID") else None
        nodes, node_rank = _number(env.get("SKYPILOT_NUM_NODES")), _number(env.get("SKYPILOT_NODE_RANK"))
    else:
        job, nodes, node_rank = None, None, None
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id is not None and not is_runner_run_id(run_id):
        return Engine("torchrun", run_id if run_id != "none" else job, nodes, node_rank)
    step = _slurm_step_id()
    if step is not None:
        return Engine("slurm", step, _number(env.get("SLURM_NNODES")), _number(env.get("SLURM_NODEID")))
    if "RAY_RAYLET_PID" in env and "RANK" in env:  # a Ray Train worker (launcher=ray): its driver named the run dir
        return Engine("ray", None, None, _number(env.get("NODE_RANK")))
    if kubeflow:
        return Engine("kubeflow", job, nodes, node_rank)
    if skypilot:
        return Engine("skypilot", job, nodes, node_rank)
    return Engine("none")


SKYPILOT_PORT_BASE = 20000
"""SkyPilot gives no rendezvous port: every node derives the same one from the task id (20000-39999), unless the
command line sets hardware.main_process_port."""


def skypilot_machine_overrides(overrides: list[str], env: dict | None = None) -> list[str]:
    """The hardware.* overrides that make the nodes of a SkyPilot task one run of the runner's own launcher
    (`python -m runner hardware=multi_gpu` in the task's `run:`, no torchrun): the node count, this node's rank,
    node 0's address (the first of SKYPILOT_NODE_IPS) and a port, each unless the command line gives it (none when
    it gives hardware.num_machines). Nothing outside a multi-node SkyPilot task, or under torchrun (its flags say
    it)."""
    env = os.environ if env is None else env
    engine = detect_engine(env)
    if engine.name != "skypilot" or not engine.nodes or engine.nodes < 2:
        return []
    given = {item.split("=", 1)[0].lstrip("+~") for item in overrides if "=" in item}
    if "hardware.num_machines" in given:  # the command line took charge of the machines: all of them
        return []
    ips = env["SKYPILOT_NODE_IPS"].split()
    task = env.get("SKYPILOT_TASK_ID", "")
    port = SKYPILOT_PORT_BASE + int(hashlib.sha256(task.encode()).hexdigest(), 16) % 20000
    wanted = {"hardware.num_machines": engine.nodes, "hardware.machine_rank": engine.node_rank,
              "hardware.main_process_ip": ips[0] if ips else None, "hardware.main_process_port": port}
    return [f"{key}={value}" for key, value in wanted.items() if key not in given and value is not None]


def whoami(info: "DistInfo", engine: Engine) -> str:
    """One line every rank logs before it joins the group: enough to see, from the logs of a whole cluster, two
    processes that believe they are the same rank, or nodes that disagree on the size of the run."""
    machines = max(1, info.world_size // max(1, info.local_world_size))
    node = engine.node_rank if engine.node_rank is not None else info.rank // max(1, info.local_world_size)
    started = "the runner" if engine.name == "none" else engine.name
    return (f"rank {info.rank} of {info.world_size} (local rank {info.local_rank}), pid {os.getpid()}, "
            f"{torch.get_num_threads()} thread(s); node {node} of {machines}, host {socket.gethostname()}, started "
            f"by {started}" + (f", job {engine.job_id}" if engine.job_id else ""))


def engine_disagreement(info: "DistInfo", engine: Engine) -> str | None:
    """Why this process would train on its own while its engine started the job on several nodes (each node
    believing it is rank 0 of a run of its own), or None. Kubeflow and SkyPilot run the command on every node, so
    their node count must be the run's machine count."""
    if engine.name not in ("kubeflow", "skypilot") or not engine.nodes or engine.nodes < 2:
        return None
    machines = max(1, info.world_size // max(1, info.local_world_size))
    if machines == engine.nodes:
        return None
    where = {"kubeflow": "PET_NNODES", "skypilot": "SKYPILOT_NUM_NODES"}[engine.name]
    return (f"{engine.name} started this job on {engine.nodes} nodes ({where}={engine.nodes}), but this process is "
            f"rank {info.rank} of a run on {machines} machine(s) (WORLD_SIZE={info.world_size}, LOCAL_WORLD_SIZE="
            f"{info.local_world_size}): each node would train alone as a run of its own. Start it as the docs' "
            f"examples do (torchrun reading the PET_* variables under Kubeflow; `python -m runner` with no "
            f"hardware.num_machines under SkyPilot), or give the job one node")


def init_process_group(info: DistInfo, backend: str | None, timeout_s: float = 1800) -> None:
    """Join the group once, on the backend the hardware names (gloo, nccl); a group that already exists is kept,
    as under torchrun. `timeout_s` bounds how long a collective waits for a peer that is gone or stuck."""
    global _drained
    if info.is_distributed and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        _drained = False


def join_group(backend: str | None) -> None:
    """Join the group when a launcher started this process as one of several (its variables say so) and nobody
    has yet; the group made here is destroyed when the process exits, and any gloo group drained (leave_at_exit)."""
    info = DistInfo.from_env()
    own = info.is_distributed and not torch_dist.is_initialized()
    if own:
        init_process_group(info, backend)
    leave_at_exit(own)


def peer_store(run_dir: str):
    """A client of the store this process group met at (torchrun's or the elastic agent's, at MASTER_ADDR and
    MASTER_PORT), its keys scoped to this launch, restart and run dir; None when there is none to reach."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not address or not port:
        return None
    store = torch_dist.TCPStore(address, int(port), is_master=False, timeout=timedelta(seconds=30))
    scope = "/".join(("runner", os.environ.get("TORCHELASTIC_RUN_ID", "run"),
                      os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), hashlib.sha256(run_dir.encode()).hexdigest()[:12]))
    return torch_dist.PrefixStore(scope + "/", store)


def new_cpu_group():
    """A gloo group over every rank, for small CPU-side agreements that must not wait for the device (the
    default group is NCCL on GPUs, and on CPUs its own collectives must not interleave with these). Every rank
    must call this at the same point."""
    return torch_dist.new_group(backend="gloo")


# How long a process that leaves a gloo group gives gloo's worker threads to let go of their last work. A thread
# drops a finished collective's tensors just after its waiter returns; when that happened during interpreter
# finalization (a script that exits right after its last reduce), the drop took the GIL and the process died with
# SIGABRT ("terminate called without an active exception", gdb: ~AsyncAllreduceWork in ProcessGroupGloo::runLoop),
# in 1 exit of 10 on a loaded 2-core machine. destroy_process_group does not end those threads while a DDP wrapper
# was ever built (the group outlives it), so they are given the time, while Python is still alive, instead.
GLOO_DRAIN_S = 0.2


_drained = True  # no gloo work since the last drain: set by destroy_process_group, cleared by a new group
_leaving = False  # leave_at_exit registered


def destroy_process_group() -> None:
    global _drained
    if torch_dist.is_initialized():
        gloo = torch_dist.get_backend() == "gloo"
        torch_dist.destroy_process_group()
        if gloo:
            time.sleep(GLOO_DRAIN_S)  # releases the GIL: the workers' last drop runs now, not in finalization
            _drained = True


def leave_at_exit(own: bool) -> None:
    """At exit, before finalization: destroy the group if this process made it (`own`), and drain a gloo group's
    threads even when the script destroyed the group itself. Accelerate's test_sync.py ends with
    `state.destroy_process_group()` and exits: under `python -m runner.launch hardware=multi_cpu` beside two CPU
    burners, 1 of 40 launches aborted before this drain (the SIGABRT above), 0 of 40 after. Registered once per
    process; a group the script made and keeps is drained, not destroyed."""
    global _leaving, _drained
    if _leaving or not torch_dist.is_initialized():
        return
    _leaving, _drained = True, False
    gloo = torch_dist.get_backend() == "gloo"

    def leave() -> None:
        if own and torch_dist.is_initialized():
            destroy_process_group()
        elif gloo and not _drained:
            time.sleep(GLOO_DRAIN_S)

    atexit.register(leave)


def keep_process_group_until_exit() -> None:
    """Under torchrun every multirun job of a rank shares one group: re-creating it on the agent's store hangs (the
    store keeps the first group's keys, so a second init_process_group waits forever for ranks that already
    joined), so it is destroyed once, when the process exits."""
    leave_at_exit(own=True)


def single_process() -> bool:
    """True when there is no group because there is one process. Several processes without a group would make
    every collective silently act on this process's data alone: that is an error, not a single process."""
    if torch_dist.is_initialized():
        return False
    if os.environ.get("WORLD_SIZE", "1") == "1":  # the common case first: a collective per log step asks
        return True
    info = DistInfo.from_env()
    if info.is_distributed:
        from runner.errors import LaunchError

        raise LaunchError(
            f"this is process {info.rank} of {info.world_size} (WORLD_SIZE is set), but it has not joined the process "
            "group, so a collective would act on this process's data alone; create a runner.Accelerator() first "
            "(it joins the group) or call torch.distributed.init_process_group()"
        )
    return True


def require_group(world_size: int) -> None:
    """Refuse a collective among `world_size` > 1 processes when this one has joined no group: it would act on
    this process's data alone, silently."""
    if world_size > 1 and not torch_dist.is_initialized():
        from runner.errors import LaunchError

        raise LaunchError(
            f"this Accelerator counts {world_size} processes, but this process has joined no process group, so a "
            "collective (gather, reduce, wait_for_everyone...) would act on its data alone; start the processes "
            "with torchrun, runner.launch or srun (Accelerator() then joins the group), or call "
            "torch.distributed.init_process_group() before making the Accelerator")


def barrier() -> None:
    if not single_process():
        torch_dist.barrier()


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce a tensor over all processes in place: "sum", "mean", "max" or "min" (a no-op in a single process)."""
    if single_process():
        return tensor
    if op == "mean":
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor.div_(torch_dist.get_world_size())
    torch_dist.all_reduce(tensor, op=REDUCE_OPS[op])
    return tensor


def all_gather_cat(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's tensor concatenated along dim 0, in rank order; first dims may differ between processes."""
    if single_process():
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
    if not single_process():
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just [obj] in a single process)."""
    if single_process():
        return [obj]
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, obj)
    return gathered


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite `tensor` (in place) with rank `src`'s on every rank (a no-op in a single process). A CPU tensor
    travels through the GPU on NCCL, which carries GPU tensors only."""
    if single_process():
        return tensor
    if tensor.device.type == "cpu" and torch_dist.get_backend() == "nccl":
        on_gpu = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        torch_dist.broadcast(on_gpu, src=src)
        return tensor.copy_(on_gpu.cpu())
    torch_dist.broadcast(tensor, src=src)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` (any picklable object) on every rank; other ranks' `obj` is ignored."""
    if single_process():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


@contextmanager
def local_main_first(info: DistInfo) -> Iterator[None]:
    """Run the body on each machine's local rank 0 first, then on the others: a dataset is generated and cached
    once per machine, and the other ranks read the cache instead of all generating it at once."""
    if not info.is_local_main:
        barrier()
    yield
    if info.is_local_main:
        barrier()


def config_digest(resolved: dict) -> str:
    return hashlib.sha256(_canonical(resolved).encode()).hexdigest()[:16]


def config_mismatch(resolved: dict) -> str | None:
    """None when every rank runs the same resolved config; otherwise a readable diff against rank 0's."""
    digests = all_gather_object(config_digest(resolved))
    if len(set(digests)) == 1:
        return None
    configs = all_gather_object(resolved)
    first_other = next(rank for rank, digest in enumerate(digests) if digest != digests[0])
    diff = difflib.unified_diff(
        _canonical(configs[0]).splitlines(),
        _canonical(configs[first_other]).splitlines(),
        fromfile="rank 0",
        tofile=f"rank {first_other}",
        lineterm="",
        n=0,
    )
    diff = [line for line in diff if not line.startswith("@@")]
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    return f"ranks {differing} resolved a different config than rank 0:\n" + "\n".join(diff)


def _canonical(resolved: dict) -> str:
    """The config as sorted `dotted.key = value` lines (so a diff names the full key), minus per-machine keys."""
    skipped = {".".join(path) for path in MACHINE_LOCAL_KEYS}
    lines = [f"{key} = {json.dumps(value)}" for key, value in flatten(json.loads(json.dumps(resolved, default=str)), empty_as_leaf=True).items()
             if key not in skipped]
    return "\n".join(sorted(lines))


def threads_per_process(info: DistInfo, requested: int | None) -> int | None:
    """`requested`, or this process's share of the cores it may use; None for a lone process nothing constrains
    (torch's own default, one thread per physical core, stands).

    The cores are those SLURM gave the task when it says (SLURM_CPUS_PER_TASK: a site that does not bind tasks to
    cores, TaskPlugin=task/none, leaves every core visible, and two jobs sharing a node would each take them all),
    else those this process may run on. When srun's tasks are the ranks each process has its task's; when one task
    starts this machine's workers, they share them."""
    if requested is not None:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    slurm_cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm_cpus.isdigit():
        sharing = 1 if _slurm_step_id() is not None else max(1, info.local_world_size)
        return max(1, min(cores, int(slurm_cpus)) // sharing)
    if info.local_world_size <= 1:
        return None
    return max(1, cores // info.local_world_size)


def exit_with_parent() -> None:
    """Ask Linux to kill this worker when the process that started it dies (even by SIGKILL), so a killed launcher
    leaves no orphaned workers behind, whatever they are doing (SIGKILL: a hung collective or a stop handler
    cannot hold it up; checkpoints are atomic, so nothing half-written survives). A no-op without prctl."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
