"""Run the workers: in this process for one, through torch's elastic launcher (torchrun's engine) for several."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from runner import worker
from runner.config import RunSpec
from runner.devices import MULTI_PROCESS_KINDS
from runner.errors import PREEMPTED_EXIT_CODE, LaunchError, Preempted


def started_by_external_launcher() -> bool:
    """torchrun / SLURM-via-torchrun already started one process per rank: do not start more."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ


def launch(spec: RunSpec) -> dict[str, float]:
    hardware = spec.config.hardware
    if started_by_external_launcher() or hardware.kind not in MULTI_PROCESS_KINDS or hardware.num_processes == 1:
        return worker.run(spec)
    return _elastic_launch(spec, hardware.num_processes)


def _leave_loky_context() -> None:
    """Inside a joblib (loky) worker, as under hydra/launcher=parallel, the default start method is "loky", which
    torch's spawn cannot use ("cannot find context for 'loky'", pytorch #44687)."""
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) == "loky":
        multiprocessing.set_start_method("spawn", force=True)


def _elastic_launch(spec: RunSpec, num_processes: int) -> dict[str, float]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _leave_loky_context()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=num_processes,
        run_id=f"runner-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # port 0: a free port, so two runs at once never collide
        max_restarts=0,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(spec.run_dir) / "ranks"), redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template="[rank${rank}]:",
    )
    try:
        results = elastic_launch(config, worker.run_spawned)(spec)
    except SignalException as err:
        # The agent got the stop signal and passed it on to the workers, which had its grace period (30 s) to
        # finish their step and save before it returned.
        raise Preempted(signal.Signals(err.sigval).name, None, Path(spec.run_dir) / "checkpoints") from None
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        if all(f.exitcode == PREEMPTED_EXIT_CODE for f in err.failures.values()):
            raise Preempted("a stop signal", None, Path(spec.run_dir) / "checkpoints") from None
        raise LaunchError(
            f"rank {rank} failed (exit code {failure.exitcode}): {failure.message or 'see its log'}; "
            f"its full output is under {Path(spec.run_dir) / 'ranks'}"
        ) from None
    return results[0]
