"""What a sweep leaves behind: one `result.json` per job and, at the sweep root, a report that ranks the jobs.

Plain Python, no Hydra: `runner.sweep.callback` (the Hydra callback) calls these functions with plain values, and the CLI
asks `finished_result` whether a re-run may skip a job. The report files:

- `<sweep dir>/sweep_report.csv` and `sweep_report.md`: one row per job (its overrides, final and best monitored
  metric, the other final metrics, steps, wall time, status, the error of a failed job), sorted by the monitored
  metric in its mode, the best marked;
- `<sweep dir>/tensorboard/<job>/`: one HParams session per job (`tensorboard --logdir <sweep dir>/tensorboard`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import yaml

from runner.errors import ConfigError
from runner.ground import better, write_text_atomically
from runner.training.metrics import read_row, write_hparams_session

RESULT_FILE = "result.json"
FAILURE_PREFIX = "result.failed-"
"""`result.failed-<host>-<pid>.json`: one process of a job failed. A job runs in several processes under torchrun
or with several SLURM tasks; only one writes result.json, and a peer that trained may write "completed" after
another one failed. The job is failed if any of its processes failed."""
REPORT_CSV = "sweep_report.csv"
REPORT_MD = "sweep_report.md"


class JobStatus(str, Enum):
    completed = "completed"
    failed = "failed"
    unfinished = "unfinished"
    """No result.json yet: the job is still running, or it was killed before it could write one."""


@dataclass
class JobResult:
    """One job's outcome, as written to `<job dir>/result.json`."""

    job: int
    status: JobStatus
    overrides: list[str]
    monitor: str
    mode: str
    value: float | None = None
    """The monitored metric at the end of the run: what the job returned to the sweeper."""
    final: dict[str, float] = field(default_factory=dict)
    """Every metric of the final evaluation."""
    best_value: float | None = None
    """The best monitored value over all evaluations of the run (in `mode`)."""
    best_step: int | None = None
    steps: int | None = None
    """The last optimizer step the run logged."""
    wall_time_s: float | None = None
    started_at: str | None = None
    error: str | None = None
    run_dir: str = ""
    stopped_early: str | None = None
    """Why a callback ended the run before its step budget (early stopping), else None."""
    exports: list[str] = field(default_factory=list)
    """The files in <run dir>/export (final and best weights, a callback's such as EMA's) when the job ended."""

    @property
    def params(self) -> dict[str, Any]:
        return parse_overrides(self.overrides)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "status": self.status.value}, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "JobResult":
        data = json.loads(text)
        known = {item.name for item in fields(cls)}
        data = {key: value for key, value in data.items() if key in known}
        return cls(**{**data, "status": JobStatus(data["status"])})


def job_result(run_dir: Path, job: int, overrides: list[str], monitor: str, mode: str, returned: Any,
               error: BaseException | None, wall_time_s: float, started_at: str) -> JobResult:
    """The result of a job that just ended: what it returned or raised, plus what its metrics.jsonl recorded."""
    final, best_value, best_step, steps = read_metrics(run_dir / "metrics.jsonl", monitor, mode)
    value = None
    if error is None and isinstance(returned, (int, float)):
        value = float(returned)
        final.setdefault(monitor, value)
        if best_value is None:
            best_value, best_step = value, steps
    return JobResult(
        job=job,
        status=JobStatus.failed if error is not None else JobStatus.completed,
        overrides=list(overrides),
        monitor=monitor,
        mode=mode,
        value=value,
        final=final,
        best_value=best_value,
        best_step=best_step,
        steps=steps,
        wall_time_s=round(wall_time_s, 3),
        started_at=started_at,
        error=None if error is None else f"{type(error).__name__}: {error}",
        run_dir=str(run_dir),
        stopped_early=_early_stop_reason(run_dir),
        exports=list_exports(run_dir),
    )


def list_exports(run_dir: Path) -> list[str]:
    export_dir = run_dir / "export"
    if not export_dir.is_dir():
        return []
    return sorted(path.name for path in export_dir.iterdir() if path.is_file() and not path.name.startswith("."))


def _early_stop_reason(run_dir: Path) -> str | None:
    """What runner.training.callbacks.EarlyStopping wrote when it stopped the run."""
    path = run_dir / "early_stopping.json"
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["reason"])
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(path: Path, monitor: str, mode: str) -> tuple[dict[str, float], float | None, int | None, int | None]:
    """(final evaluation metrics, best monitored value, its step, last step) from a metrics.jsonl; empty without one."""
    if not path.is_file():
        return {}, None, None, None
    final: dict[str, float] = {}
    best_value, best_step, steps = None, None, None
    for line in path.read_text(encoding="utf-8").splitlines():
        row = read_row(line)
        if row is None:
            continue
        step = row.pop("step", None)
        steps = step if steps is None or (step is not None and step > steps) else steps
        evaluation = {key: value for key, value in row.items() if key.startswith("val/")}
        if evaluation:
            final = evaluation
        value = row.get(monitor)
        if isinstance(value, (int, float)) and math.isfinite(value) and (best_value is None or better(value, best_value, mode)):
            best_value, best_step = value, step
    return final, best_value, best_step, steps


def write_result(result: JobResult) -> None:
    write_text_atomically(Path(result.run_dir) / RESULT_FILE, result.to_json())


def write_process_failure(result: JobResult) -> None:
    """Record that this process of the job failed (kept beside result.json, which one process owns)."""
    import socket

    name = f"{FAILURE_PREFIX}{socket.gethostname()}-{os.getpid()}.json"
    write_text_atomically(Path(result.run_dir) / name, result.to_json())


def clear_process_failures(run_dir: Path) -> None:
    """A job starting again (a re-run of the sweep) starts without the failures of its last attempt."""
    for path in run_dir.glob(f"{FAILURE_PREFIX}*.json"):
        path.unlink(missing_ok=True)


def _process_failure(run_dir: Path) -> JobResult | None:
    for path in sorted(run_dir.glob(f"{FAILURE_PREFIX}*.json")):
        try:
            return JobResult.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return None


def finished_result(run_dir: Path, overrides: list[str]) -> JobResult | None:
    """The recorded result if this job dir already holds a completed run of the same overrides (`resume=` aside)."""
    result = _recorded(run_dir)
    if result is None or _process_failure(run_dir) is not None:
        return None
    if result.status != JobStatus.completed or result.value is None:
        return None
    return result if _without_resume(result.overrides) == _without_resume(overrides) else None


def other_jobs_result(run_dir: Path, overrides: list[str]) -> JobResult | None:
    """The result recorded in this job dir by a job of other overrides (`resume=` aside): an earlier sweep into the
    same sweep dir whose job of this number was another experiment. Its record is not this job's to replace."""
    result = _recorded(run_dir)
    return result if result is not None and _without_resume(result.overrides) != _without_resume(overrides) else None


class OtherJobsDir(ConfigError):
    names_run_dir_state = False  # its checkpoints are the other experiment's: nothing to continue from here


def refuse_other_jobs_dir(job_dir: Path, overrides: list[str]) -> None:
    """A sweep into a sweep dir that an earlier sweep of other overrides wrote: job N's dir holds that sweep's job
    N, another experiment, which neither a fresh start nor resume=auto may take over (resume=auto would continue it
    with this job's settings, or report its result as this job's)."""
    other = other_jobs_result(job_dir, overrides)
    if other is not None:
        raise OtherJobsDir("hydra.sweep.dir", (
            f"{job_dir} holds job {other.job} of an earlier sweep with other overrides "
            f"({' '.join(other.overrides) or 'none'}; this job has {' '.join(overrides) or 'none'}); a sweep "
            "continues in its sweep dir only with the same overrides: give this one a new hydra.sweep.dir"))


def _recorded(run_dir: Path) -> JobResult | None:
    try:
        return JobResult.from_json((run_dir / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none, or unreadable: run the job again rather than trust it


def _without_resume(overrides: list[str]) -> list[str]:
    return sorted(item for item in overrides if item.lstrip("+~").split("=", 1)[0] != "resume")


def write_hparams(sweep_dir: Path, result: JobResult) -> None:
    """This job's row in the HParams tab at `<sweep dir>/tensorboard`: its overrides against its metrics."""
    hparams = {**result.params, "status": result.status.value}
    metrics = {f"final/{name}": value for name, value in result.final.items()}
    if result.best_value is not None:
        metrics[f"best/{result.monitor}"] = result.best_value
    if result.wall_time_s is not None:
        metrics["wall_time_s"] = result.wall_time_s
    if result.steps is not None:
        metrics["steps"] = float(result.steps)
    write_hparams_session(sweep_dir / "tensorboard" / str(result.job), hparams, metrics)


def write_report(sweep_dir: Path, monitor: str, mode: str) -> list[JobResult]:
    """(Re)write the CSV and Markdown reports from every job under the sweep dir; returns the rows, best first."""
    with _locked(sweep_dir / ".report.lock"):
        results = ranked(collect_results(sweep_dir, monitor, mode), mode)
        columns = varying_params(results)
        write_text_atomically(sweep_dir / REPORT_CSV, render_csv(results, columns, monitor))
        write_text_atomically(sweep_dir / REPORT_MD, render_markdown(results, columns, monitor, mode))
    return results


def collect_results(sweep_dir: Path, monitor: str, mode: str) -> list[JobResult]:
    """Every job dir's result.json; a job dir without one (running or killed) is listed as unfinished, and one where
    any process failed as failed, whatever the others recorded."""
    finished = {path.parent for path in sweep_dir.rglob(RESULT_FILE)}
    failed = {path.parent for path in sweep_dir.rglob(f"{FAILURE_PREFIX}*.json")}
    started = {path.parent.parent for path in sweep_dir.rglob(".hydra/overrides.yaml")}
    results = []
    for run_dir in sorted(finished | failed | started):
        recorded = JobResult.from_json((run_dir / RESULT_FILE).read_text(encoding="utf-8")) \
            if run_dir in finished else None
        failure = _process_failure(run_dir) if run_dir in failed else None
        if failure is not None and (recorded is None or recorded.status != JobStatus.failed):
            results.append(failure if recorded is None else
                           JobResult(**{**recorded.__dict__, "status": JobStatus.failed, "error": failure.error,
                                        "value": None}))
            continue
        if recorded is not None:
            results.append(recorded)
            continue
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8")) or []
        job = int(run_dir.name) if run_dir.name.isdigit() else -1
        results.append(JobResult(job, JobStatus.unfinished, overrides, monitor, mode, run_dir=str(run_dir)))
    return results


def ranked(results: list[JobResult], mode: str) -> list[JobResult]:
    """Completed jobs by their monitored value (best first, ties by job number), then the others by job number."""
    done = [r for r in results if r.status == JobStatus.completed and r.value is not None and math.isfinite(r.value)]
    rest = [r for r in results if r not in done]
    done.sort(key=lambda r: ((-r.value if mode == "max" else r.value), r.job))
    return done + sorted(rest, key=lambda r: r.job)


def varying_params(results: list[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (all keys when there is one job): the report's columns.
    `resume` is left out: a re-run adds it to the jobs it runs again, and it says nothing about the trial."""
    keys: list[str] = []
    for result in results:
        keys += [key for key in result.params if key not in keys and key != "resume"]
    if len(results) < 2:
        return keys
    return [key for key in keys if len({repr(r.params.get(key)) for r in results}) > 1]


def report_rows(results: list[JobResult], columns: list[str], monitor: str) -> list[dict[str, Any]]:
    metric_names = _metric_names(results, monitor)
    rows = []
    for rank, result in enumerate(results, start=1):
        is_best = rank == 1 and result.status == JobStatus.completed and result.value is not None
        row = {"rank": rank, "best": is_best, "job": result.job, "status": result.status.value}
        row.update({key: result.params.get(key, "") for key in columns})
        row.update({name: result.final.get(name, "") for name in metric_names})
        row[f"best {monitor}"] = _blank(result.best_value)
        row.update(best_step=_blank(result.best_step), steps=_blank(result.steps),
                   wall_time_s=_blank(result.wall_time_s), error=result.error or "",
                   overrides=" ".join(result.overrides), run_dir=result.run_dir)
        rows.append(row)
    return rows


def render_csv(results: list[JobResult], columns: list[str], monitor: str) -> str:
    rows = report_rows(results, columns, monitor)
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def render_markdown(results: list[JobResult], columns: list[str], monitor: str, mode: str) -> str:
    counts = {status: sum(r.status == status for r in results) for status in JobStatus}
    summary = ", ".join(f"{count} {status.value}" for status, count in counts.items() if count)
    lines = [
        "# Sweep report",
        "",
        f"{len(results)} jobs ({summary or 'none yet'}), sorted by {monitor} ({mode}), best first.",
    ]
    rows = report_rows(results, columns, monitor)
    if rows and rows[0]["best"]:
        lines.append(f"Best: job {rows[0]['job']} ({monitor}={_fmt(results[0].value)}), {results[0].run_dir}")
    lines.append("")
    if rows:
        header = [name for name in rows[0] if name not in ("best", "overrides", "run_dir")]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for row in rows:
            cells = [_cell(row[name]) for name in header]
            cells[0] = f"**{row['rank']} (best)**" if row["best"] else cells[0]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`key=value` command-line overrides as {key: value}, numbers and booleans typed (for columns and HParams)."""
    params: dict[str, Any] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        params[key.lstrip("+~")] = _typed(value)
    return params


def _typed(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _metric_names(results: list[JobResult], monitor: str) -> list[str]:
    """The final metrics' names, the monitored one first."""
    names: list[str] = [monitor]
    for result in results:
        names += [name for name in result.final if name not in names]
    return names


def _blank(value: Any) -> Any:
    return "" if value is None else value


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _cell(value: Any) -> str:
    text = _fmt(value)
    return text.replace("|", "\\|").replace("\n", " ")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Jobs running in parallel (joblib, SLURM) each refresh the report when they end: one at a time."""
    from filelock import FileLock  # portable (fcntl is POSIX-only); runner/run/rundir.py locks run dirs the same way

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


