"""hardware.launcher=ray: the workers of a multi_cpu / multi_gpu run as a Ray Train `TorchTrainer` on a Ray cluster.

    launch (this process)     -> prepare the data once, ray.init(hardware.ray_address), TorchTrainer.fit()
    each Ray Train worker     -> worker.run(spec) in Ray's process group (joined by Ray: no second init),
                                 then ray.train.report(the final metrics)

Ray places hardware.num_processes workers (one CPU each, or one GPU each on multi_gpu) anywhere on its cluster, so
the run dir must be a path every worker sees (one machine, or a shared file system). Ray's own files go to
`<run dir>/ray/`. hardware.max_restarts is Ray's FailureConfig(max_failures=N): Ray restarts the whole worker group
after a worker dies, and each restarted attempt continues from the newest intact checkpoint in the run dir, as the
runner's own launcher does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from runner.config import RunSpec
from runner.errors import LaunchError
from runner.ground import write_text_atomically

log = logging.getLogger(__name__)

RAY_DIR = "ray"
"""Ray's storage path for the run (its result files), inside the run dir."""
STARTED_MARKER = "started"
"""Written in RAY_DIR by the first attempt's rank 0: a later attempt of the worker group is a restart."""
FINAL_METRICS = "final_metrics.json"
"""Rank 0's final metrics, in RAY_DIR, for the launching process (Ray's Result holds metrics only with a
checkpoint reported to Ray, and the runner keeps its own checkpoints)."""


def launch_on_ray(spec: RunSpec) -> dict[str, float]:
    """Start the run's workers as a Ray Train TorchTrainer and wait for them: rank 0's final metrics."""
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError as err:
        raise LaunchError(f"hardware.launcher=ray needs Ray Train, which is not installed ({err}); install it with "
                          "pip install 'ray[train]' (the project's `ray` extra)") from None
    from runner.launch import worker

    hardware = spec.hardware
    workers = hardware.processes_per_machine * hardware.num_machines
    worker.prepare_data(spec.config)  # generate and cache once, here, before the workers read it
    address, named_by = cluster_address(spec.config.hardware.ray_address)
    if not ray.is_initialized():
        _connect(ray, address, named_by, workers)
    _say_what_the_cluster_lacks(ray, address, workers, hardware.device_type == "cuda")
    log.info("launching %d Ray Train worker(s) on the Ray cluster %s; their logs: %s", workers,
             "started here for this run" if address == OWN_INSTANCE else f"{address} (named by {named_by})",
             Path(spec.run_dir) / "runner_rank<N>.log")
    storage = Path(spec.run_dir).resolve() / RAY_DIR
    trainer = TorchTrainer(
        _ray_worker, train_loop_config={"spec": spec},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=hardware.device_type == "cuda",
                                     resources_per_worker=None if hardware.device_type == "cuda" else {"CPU": 1}),
        torch_config=TorchConfig(backend=hardware.backend, timeout_s=int(hardware.timeout_s)),
        run_config=RunConfig(name="train", storage_path=str(storage), failure_config=FailureConfig(
            max_failures=hardware.max_restarts)),
    )
    try:
        trainer.fit()
    except Exception as err:  # Ray's TrainingFailedError and friends: the worker's own report is in its log
        raise LaunchError(f"the Ray Train workers failed: {_last_line(err)}\n  their logs: "
                          f"{Path(spec.run_dir) / 'runner_rank<N>.log'}") from None
    return json.loads((storage / FINAL_METRICS).read_text())


def _ray_worker(config: dict) -> None:
    """One Ray Train worker: Ray has joined the process group and set RANK, WORLD_SIZE, LOCAL_RANK... as torchrun
    would. A restarted attempt (Ray's FailureConfig) continues from the newest intact checkpoint in the run dir."""
    import ray.train

    from runner.checkpoint.resume import newest_intact
    from runner.distributed.dist import DistInfo, barrier
    from runner.launch import worker

    spec: RunSpec = config["spec"]
    dist = DistInfo.from_env()
    worker.log_to_rank_file(Path(spec.run_dir) / f"runner_rank{dist.rank}.log", console=False)
    marker = Path(spec.run_dir).resolve() / RAY_DIR / STARTED_MARKER
    restarted = marker.exists()
    barrier()  # every rank has looked before rank 0 writes it
    if dist.is_main and not restarted:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    if restarted:
        newest = newest_intact(Path(spec.run_dir) / "checkpoints", spec.config.checkpoint.verify)
        if newest is not None:
            log.info("Ray restarted the workers: continuing from %s", newest)
            spec = dataclasses.replace(spec, resume_from=str(newest))
    final = worker.run(spec, keep_process_group=True)  # the group is Ray's: it ends it
    numbers = {key: value for key, value in final.items() if isinstance(value, (int, float))}
    if dist.is_main:
        write_text_atomically(marker.parent / FINAL_METRICS, json.dumps(numbers))
    ray.train.report(numbers)  # what Ray shows; every worker reports, as Ray Train asks


OWN_INSTANCE = "local"
"""ray.init's address for a Ray instance started for this run alone, even where another runs on this machine."""


def cluster_address(ray_address: str | None) -> tuple[str, str]:
    """(the address ray.init is given, the setting that named it) for hardware.ray_address: the one given; for
    null, the cluster RAY_ADDRESS names (what `ray job submit` sets for the job it starts), else a Ray instance of
    the run's own. Ray's own ray.init() without an address would join the newest cluster `ray start` left on this
    machine, one the user did not name, whose workers need not see this run's files or Python path."""
    if ray_address:
        return ray_address, "hardware.ray_address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return OWN_INSTANCE, "hardware.ray_address"


def _connect(ray, address: str, named_by: str, workers: int) -> None:
    """ray.init: a Ray instance started here for this run (OWN_INSTANCE), or the cluster at `address`. An address
    where nothing listens is named at once: Ray itself retries the connection for minutes, printing only its
    warnings."""
    host, _, port = address.rpartition(":")
    if "://" not in address and host and port.isdigit():
        import socket

        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as err:
            raise LaunchError(f"{named_by}: is {address}, where no Ray cluster answers ({err}); give the address "
                              "`ray start --head` printed (HOST:6379), auto for the cluster started on this machine, "
                              "or null (with RAY_ADDRESS unset) to start one for this run") from None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({"num_cpus": max(workers, _cpus())} if address == OWN_INSTANCE else {}))
    except ConnectionError as err:  # address=auto with no cluster running here, among others
        raise LaunchError(f"{named_by}: is {address}, and no Ray cluster was found ({_last_line(err)}); start one "
                          "with `ray start --head` and give its address (or auto on that machine), or leave "
                          "hardware.ray_address null (with RAY_ADDRESS unset) to start one for this run") from None


def _say_what_the_cluster_lacks(ray, address: str, workers: int, gpus: bool) -> None:
    """Ray Train waits, with no word, until the cluster has a CPU (or GPU) per worker: say so when it has fewer
    now. An autoscaling cluster adds nodes for them, so this is a warning, not a refusal."""
    kind = "GPU" if gpus else "CPU"
    has = ray.cluster_resources().get(kind, 0)
    if has < workers:
        log.warning("the Ray cluster %s has %g %s(s) in all and the %d Ray Train worker(s) take one each: Ray waits "
                    "until the cluster has them (an autoscaling cluster adds nodes); otherwise lower "
                    "hardware.num_processes or add nodes (Ctrl-C stops the wait)", address, has, kind, workers)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
