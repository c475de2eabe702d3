"""The sweep callback: Hydra tells it when a sweep starts, when each job ends and when the sweep ends.

A Hydra-facing module, like cli.py: registered in `conf/config.yaml` under `hydra.callbacks`, it turns Hydra's
job records into plain values and hands them to `runner.sweep.report`. It runs where each job runs (in-process, in a
joblib worker, in a SLURM job), so each job writes its own `result.json` and refreshes the sweep report: the
report is complete even when the sweep ends in an error (Hydra's basic sweeper raises after the last job when one
failed, and then never calls `on_multirun_end`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner.sweep import report
from runner.distributed.dist import started_by_external_launcher, writes_run_dir
from runner.errors import LaunchError, exit_with
from runner.run.compose import BASIC_SWEEPER

log = logging.getLogger("runner")



class SweepJobFailed(CompactHydraException):
    """A sweep job's error, already printed as one paragraph when the job ended. Hydra re-raises the first failed
    job's error after the last job; this kind it prints as its message alone, without a traceback."""


def job_error(error: BaseException | None) -> BaseException | None:
    """The error a job really ended with (what result.json and the report show)."""
    return error.__cause__ if isinstance(error, SweepJobFailed) and error.__cause__ is not None else error


class SweepReport(Callback):
    """Per job: `result.json` (also for a failed job) and a row in the HParams view. Per sweep: the report."""

    def __init__(self) -> None:
        self._started = 0.0
        self._started_at = ""
        self._skipped: report.JobResult | None = None
        self._others = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_slurm_request(config)
        _make_storage_dir(OmegaConf.select(config, "hydra.sweeper.storage"))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._started = time.perf_counter()
        self._started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        run_dir = Path(config.hydra.runtime.output_dir)
        # Another experiment's job dir (the CLI refuses to run this job in it): its record stays as it is.
        self._others = report.other_jobs_result(run_dir, _overrides(config)) is not None
        if _writes(config) and not self._others:
            report.clear_process_failures(run_dir)
        # The CLI makes the same decision (resume=auto on a finished job) and returns the recorded value.
        self._skipped = (
            report.finished_result(run_dir, _overrides(config)) if OmegaConf.select(config, "resume") == "auto" else None
        )

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if OmegaConf.select(config, "trainer.fast_dev_run") is not None:
            return  # a debug run writes nothing but its log
        failed = job_return.status == JobStatus.FAILED
        if self._others:
            self._refresh_report(config)
            return
        if not _writes(config):
            # Every rank (torchrun) or machine runs the job and one of them records it; a failure anywhere also
            # fails the job, whatever the recording process saw.
            if failed:
                report.write_process_failure(self._result(config, job_return))
                self._refresh_report(config)
            return
        result = self._skipped or self._result(config, job_return)
        exports = report.list_exports(Path(result.run_dir))
        if self._skipped is None or exports != result.exports:  # resume=auto may have written a missing export
            result.exports = exports
            report.write_result(result)
            if failed:  # kept beside result.json: a peer that trained cannot overwrite it with "completed"
                report.write_process_failure(result)
        if config.hydra.mode == RunMode.MULTIRUN:
            report.write_hparams(_sweep_dir(config), result)
        self._refresh_report(config)

    def _refresh_report(self, config: DictConfig) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            report.write_report(_sweep_dir(config), config.trainer.monitor, _mode(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not _writes(config):
            return
        sweep_dir = _sweep_dir(config)
        results = report.write_report(sweep_dir, config.trainer.monitor, _mode(config))
        log.info("sweep report (%d jobs): %s", len(results), sweep_dir / report.REPORT_MD)

    def _result(self, config: DictConfig, job_return: JobReturn) -> report.JobResult:
        failed = job_return.status == JobStatus.FAILED
        return report.job_result(
            run_dir=Path(config.hydra.runtime.output_dir),
            job=int(OmegaConf.select(config, "hydra.job.num", default=0) or 0),
            overrides=_overrides(config),
            monitor=config.trainer.monitor,
            mode=_mode(config),
            returned=None if failed else job_return.return_value,
            error=job_error(job_return._return_value) if failed else None,  # .return_value re-raises it
            wall_time_s=time.perf_counter() - self._started,
            started_at=self._started_at,
        )


def refuse_search_under_torchrun(config: DictConfig) -> None:
    """Under torchrun every rank runs this process: a sampling sweeper would pick different values per rank."""
    sweeper = OmegaConf.select(config, "hydra.sweeper._target_")
    if started_by_external_launcher() and sweeper != BASIC_SWEEPER:
        err = LaunchError(
            f"hydra.sweeper: a search ({sweeper.rsplit('.', 1)[-1]}) cannot run under torchrun or any launcher that "
            "starts one process per rank: each rank would sample its own hyperparameters. Start the search from "
            "one process instead, e.g. `python -m runner hparams_search=lr_width hardware=multi_cpu` (or "
            "hardware=multi_gpu): the values are sampled once, in that process, and the runner starts each trial's "
            "ranks itself; on SLURM add hydra/launcher=slurm."
        )
        exit_with(err)  # a callback's ordinary exceptions are only warned about by Hydra


SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


def check_slurm_request(config: DictConfig) -> None:
    """hydra/launcher=slurm, before anything is submitted: a trial layout the runner cannot run (several tasks or
    nodes per trial), or a request no node of the partition can meet (it would pend forever), ends the sweep now
    in one paragraph."""
    from runner.run import slurm

    if OmegaConf.select(config, "hydra.launcher._target_") != SLURM_LAUNCHER:
        return
    launcher = config.hydra.launcher
    # Unresolved: '${oc.env:SLURM_NNODES}' only resolves inside the job, and is what makes nodes > 1 one group.
    num_machines = config.hardware._get_node("num_machines")._value()
    problem = slurm.layout_problem(int(launcher.tasks_per_node), int(launcher.nodes), num_machines)
    kind = str(getattr(config.hardware.kind, "value", config.hardware.kind))
    if problem is None and kind == "multi_gpu" and launcher.gpus_per_node is None:
        problem = ("hardware.num_processes: hardware=multi_gpu under hydra/launcher=slurm needs the number of GPUs "
                   "each trial asks for (null means every visible GPU, which is only known once the job runs): set "
                   "hardware.num_processes=N, and the request follows (gpus_per_node=N)")
    try:
        if problem is not None:
            raise LaunchError(problem)
        slurm.check_partition(slurm.Request(
            partition=launcher.partition, nodes=int(launcher.nodes), tasks_per_node=int(launcher.tasks_per_node),
            cpus_per_task=launcher.cpus_per_task, mem_gb=launcher.mem_gb, gpus_per_node=launcher.gpus_per_node,
            timeout_min=int(launcher.timeout_min)))
    except LaunchError as err:
        exit_with(err)  # a callback's ordinary exceptions are only warned about by Hydra


def _writes(config: DictConfig) -> bool:
    return writes_run_dir(int(OmegaConf.select(config, "hardware.machine_rank", default=0) or 0))


def _make_storage_dir(storage: Any) -> None:
    """sqlite does not create the folder of its database file: make it, so `outputs/optuna/x.db` works first time."""
    prefix = "sqlite:///"
    if isinstance(storage, str) and storage.startswith(prefix) and storage != prefix + ":memory:":
        Path(storage[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)


def _sweep_dir(config: DictConfig) -> Path:
    """Absolute, from where the command was run (a job with hydra.job.chdir=true runs inside its own dir)."""
    return (Path(config.hydra.runtime.cwd) / str(config.hydra.sweep.dir)).resolve()


def _overrides(config: DictConfig) -> list[str]:
    return [str(item) for item in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]


def _mode(config: DictConfig) -> str:
    mode = config.trainer.monitor_mode
    return str(getattr(mode, "value", mode))
