"""Run the workers: in this process for one, through torch's elastic launcher (torchrun's engine) for several.

    one process                 -> worker.run(spec), here
    started by torchrun / SLURM -> worker.run(spec) in every rank, no respawn (RANK etc. already set)
    several processes/machines  -> elastic_launch(N workers per machine) -> worker.run_spawned(spec) in each

The parent has already composed, checked and resolved the config; workers get it frozen, as an argument.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from runner import worker
from runner.config import HardwareConfig, HardwareKind, RunSpec
from runner.devices import MULTI_PROCESS_KINDS, parse_gpu_ids, physical_gpu_count
from runner.dist import DistInfo, cuda_visible_devices, threads_per_process
from runner.errors import PREEMPTED_EXIT_CODE, LaunchError, Preempted
from runner.failures import root_cause

log = logging.getLogger(__name__)

RANK_OUTPUT_DIR = "ranks"  # the launcher's raw stdout/stderr of every rank, under the run dir


def started_by_external_launcher() -> bool:
    """torchrun / SLURM-via-torchrun already started one process per rank: do not start more."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ


def launch(spec: RunSpec) -> dict[str, float]:
    hardware = spec.config.hardware
    if started_by_external_launcher():
        return worker.run(spec, keep_process_group=True)
    num_processes = processes_per_machine(hardware, spec.config.gpu_ids)
    if hardware.kind not in MULTI_PROCESS_KINDS or num_processes * hardware.num_machines == 1:
        return worker.run(spec)
    return elastic_launch(spec, num_processes)


def resolve_num_processes(spec: RunSpec) -> None:
    """Fill in a null hardware.num_processes (typed config and resolved dict alike), in the parent, before the GPU
    checks and config.yaml use it."""
    count = processes_per_machine(spec.config.hardware, spec.config.gpu_ids)
    spec.config.hardware.num_processes = count
    spec.resolved.setdefault("hardware", {})["num_processes"] = count


def processes_per_machine(hardware: HardwareConfig, gpu_ids) -> int:
    """hardware.num_processes, or its default: one per GPU in gpu_ids on multi_gpu, 2 on multi_cpu, else 1."""
    if hardware.num_processes is not None:
        return hardware.num_processes
    if hardware.kind is HardwareKind.multi_gpu:
        return count_gpu_ids(gpu_ids)
    return 2 if hardware.kind is HardwareKind.multi_cpu else 1


def count_gpu_ids(gpu_ids) -> int:
    """How many GPUs `gpu_ids` selects: the listed ones, or every visible GPU for all/null (those in an inherited
    CUDA_VISIBLE_DEVICES, else those on the machine). 1 for a selection that does not parse: the GPU checks
    report it."""
    try:
        ids = parse_gpu_ids(gpu_ids)
    except ValueError:
        return 1
    if ids is not None:
        return len(ids)
    inherited = cuda_visible_devices()
    if inherited is not None:
        return max(1, len([token for token in inherited.split(",") if token.strip()]))
    return max(1, physical_gpu_count() or 0)


def launch_config(spec: RunSpec, num_processes: int):
    """The elastic launcher's settings for this run: one machine on a free local port, or `num_machines` meeting
    at machine 0's static rendezvous (machine m holds global ranks m*N .. m*N+N-1, like torchrun --node-rank)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    hardware = spec.config.hardware
    if hardware.num_machines == 1:
        # Port 0: the rendezvous picks a free port, so two runs at once never collide.
        rendezvous = dict(rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=f"runner-{uuid.uuid4().hex[:8]}",
                          rdzv_configs={"timeout": hardware.timeout_s})
    else:
        rendezvous = dict(rdzv_backend="static", rdzv_endpoint=f"{hardware.main_process_ip}:{hardware.main_process_port}",
                          run_id="runner", rdzv_configs={"rank": hardware.machine_rank, "timeout": hardware.timeout_s})
    return LaunchConfig(
        min_nodes=hardware.num_machines,
        max_nodes=hardware.num_machines,
        nproc_per_node=num_processes,
        max_restarts=0,
        start_method=hardware.start_method.value,
        shutdown_timeout=hardware.shutdown_timeout_s,
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(spec.run_dir) / RANK_OUTPUT_DIR), redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template="[rank${rank}]:",
        **rendezvous,
    )


@contextmanager
def omp_threads_for_workers(threads: int) -> Iterator[None]:
    """OMP_NUM_THREADS for the workers started inside this block, unless the user set it (torchrun does the same).
    OpenMP reads it once, when torch loads, so a spawned worker needs it in its environment from the start; each
    worker also calls torch.set_num_threads. A forked worker inherits this process's OpenMP state instead."""
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        del os.environ["OMP_NUM_THREADS"]


def leave_loky_start_method() -> None:
    """Inside a joblib launcher's (loky) worker the default start method is "loky", from which torch cannot start
    processes (`cannot find context for 'loky'`, pytorch #44687): fall back to spawn there."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) == "loky":
        multiprocessing.set_start_method("spawn", force=True)


def elastic_launch(spec: RunSpec, num_processes: int) -> dict[str, float]:
    """Start this machine's workers and wait for them; the final metrics of its lowest rank (rank 0 on machine 0;
    every rank holds the same, gathered across all processes)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch as torch_elastic_launch

    hardware = spec.config.hardware
    leave_loky_start_method()
    worker.prepare_data(spec.config)  # generate and cache once, here, before the ranks read it
    log.info(
        "launching %d worker process(es) on machine %d of %d (%s start) from pid %d; their logs: %s",
        num_processes, hardware.machine_rank, hardware.num_machines, hardware.start_method.value, os.getpid(),
        Path(spec.run_dir) / "runner_rank<N>.log",
    )
    try:
        with omp_threads_for_workers(threads_per_process(DistInfo(local_world_size=num_processes),
                                                         hardware.threads_per_process)):
            results = torch_elastic_launch(launch_config(spec, num_processes), worker.run_spawned)(spec)
    except ChildFailedError as err:
        if all(failure.exitcode == PREEMPTED_EXIT_CODE for failure in err.failures.values()):
            raise Preempted("a stop signal", None, Path(spec.run_dir) / "checkpoints") from None
        rank, message = root_cause(err.failures)
        raise LaunchError(f"{message}\n  its full log: {Path(spec.run_dir) / f'runner_rank{rank}.log'}") from None
    except SignalException as err:
        # The agent got the stop signal (a scheduler's SIGTERM, Ctrl-C) and passed it on to the workers, which had
        # its grace period to finish their step and save before it returned.
        raise Preempted(signal.Signals(err.sigval).name, None, Path(spec.run_dir) / "checkpoints") from None
    except Exception as err:  # the rendezvous itself failed (a machine never came, a port was taken)
        raise LaunchError(f"the workers could not start: {type(err).__name__}: {err}") from None
    return results[min(results)]
