"""The sweep report from per-job result.json files: ranking, columns, failed and unfinished jobs, HParams."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from runner.sweep import report
from runner.sweep.report import JobResult, JobStatus


def make_job(sweep: Path, job: int, overrides: list[str], *, losses: list[float] | None = None,
             error: Exception | None = None, monitor: str = "val/loss", mode: str = "min") -> JobResult:
    """A job dir as a sweep leaves it: .hydra/overrides.yaml, metrics.jsonl (one eval per step), result.json."""
    run_dir = sweep / str(job)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in overrides))
    if losses is not None:
        rows = [row for step, loss in enumerate(losses, start=1) for row in
                ({"step": step, "train/loss": 9.0}, {"step": step, "val/loss": loss, "val/accuracy": 1 - loss / 10})]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    last = {"val/loss": losses[-1], "val/accuracy": 1 - losses[-1] / 10} if losses else {}
    returned = None if error else last.get(monitor)
    result = report.job_result(run_dir, job, overrides, monitor, mode, returned, error, 1.5, "2026-01-01T00:00:00")
    report.write_result(result)
    return result


def test_job_result_reads_final_best_and_steps(tmp_path):
    """From the job's metrics.jsonl."""
    result = make_job(tmp_path, 0, ["optimizer.lr=0.001"], losses=[2.0, 1.0, 1.5])
    assert result.status == JobStatus.completed
    assert result.value == 1.5  # what the job returned: the final monitored value
    assert result.final == {"val/loss": 1.5, "val/accuracy": pytest.approx(0.85)}
    assert (result.best_value, result.best_step, result.steps) == (1.0, 2, 3)
    assert JobResult.from_json((tmp_path / "0" / "result.json").read_text()) == result


def test_best_follows_the_mode(tmp_path):
    result = make_job(tmp_path, 0, [], losses=[2.0, 1.0, 1.5], monitor="val/accuracy", mode="max")
    assert (result.best_value, result.best_step) == (pytest.approx(0.9), 2)


def test_failed_job_records_its_error(tmp_path):
    result = make_job(tmp_path, 3, ["model.d_model=30"], error=ValueError("embed_dim must be divisible by num_heads"))
    saved = json.loads((tmp_path / "3" / "result.json").read_text())
    assert saved["status"] == "failed"
    assert saved["error"] == "ValueError: embed_dim must be divisible by num_heads"
    assert saved["value"] is None and saved["wall_time_s"] == 1.5
    assert result.params == {"model.d_model": 30}


def test_report_ranks_by_monitor_with_failures_last(tmp_path):
    """Ranked by the monitor in its mode (min here); failed jobs come last."""
    make_job(tmp_path, 0, ["optimizer.lr=0.1", "data.num_train=256"], losses=[3.0])
    make_job(tmp_path, 1, ["optimizer.lr=0.01", "data.num_train=256"], losses=[1.0])
    make_job(tmp_path, 2, ["optimizer.lr=-1", "data.num_train=256"], error=ValueError("Invalid learning rate: -1"))
    make_job(tmp_path, 3, ["optimizer.lr=0.001", "data.num_train=256"], losses=[2.0])

    results = report.write_report(tmp_path, "val/loss", "min")
    assert [r.job for r in results] == [1, 3, 0, 2]

    rows = list(csv.DictReader((tmp_path / report.REPORT_CSV).open()))
    assert [row["job"] for row in rows] == ["1", "3", "0", "2"]
    assert [row["best"] for row in rows] == ["True", "False", "False", "False"]
    assert [row["val/loss"] for row in rows] == ["1.0", "2.0", "3.0", ""]
    assert rows[3]["status"] == "failed" and rows[3]["error"] == "ValueError: Invalid learning rate: -1"
    assert "data.num_train" not in rows[0]  # the same in every job: not a column
    assert rows[0]["optimizer.lr"] == "0.01"
    assert rows[0]["overrides"] == "optimizer.lr=0.01 data.num_train=256"

    markdown = (tmp_path / report.REPORT_MD).read_text()
    assert "4 jobs (3 completed, 1 failed), sorted by val/loss (min), best first." in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| rank | job | status | optimizer.lr | val/loss | val/accuracy | best val/loss |")
    assert table[1].startswith("| **1 (best)** | 1 | completed | 0.01 | 1 |")
    assert table[4].startswith("| 4 | 2 | failed | -1 |") and table[4].endswith("| ValueError: Invalid learning rate: -1 |")


def test_max_mode_ranks_largest_first(tmp_path):
    for job, losses in enumerate(([2.0], [1.0], [3.0])):
        make_job(tmp_path, job, [f"seed={job}"], losses=losses, monitor="val/accuracy", mode="max")
    assert [r.job for r in report.write_report(tmp_path, "val/accuracy", "max")] == [1, 0, 2]


def test_a_job_without_result_is_listed_as_unfinished(tmp_path):
    make_job(tmp_path, 0, ["seed=0"], losses=[1.0])
    (tmp_path / "1" / ".hydra").mkdir(parents=True)
    (tmp_path / "1" / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    results = report.write_report(tmp_path, "val/loss", "min")
    assert [(r.job, r.status) for r in results] == [(0, JobStatus.completed), (1, JobStatus.unfinished)]
    assert results[1].params == {"seed": 1}


def test_markdown_escapes_pipes_and_newlines_in_errors(tmp_path):
    make_job(tmp_path, 0, ["seed=0"], error=RuntimeError("a | b\nsecond line"))
    report.write_report(tmp_path, "val/loss", "min")
    markdown = (tmp_path / report.REPORT_MD).read_text()
    assert "RuntimeError: a \\| b second line" in markdown


def test_finished_result_matches_all_but_resume(tmp_path):
    """A finished result matches the job's overrides, whatever resume= is; a failed or absent job never does."""
    make_job(tmp_path, 0, ["optimizer.lr=0.1"], losses=[1.0])
    make_job(tmp_path, 1, ["optimizer.lr=0.2"], error=RuntimeError("boom"))
    assert report.finished_result(tmp_path / "0", ["optimizer.lr=0.1", "resume=auto"]).value == 1.0
    assert report.finished_result(tmp_path / "0", ["optimizer.lr=0.3", "resume=auto"]) is None  # other values
    assert report.finished_result(tmp_path / "1", ["optimizer.lr=0.2", "resume=auto"]) is None  # failed: run again
    assert report.finished_result(tmp_path / "9", ["optimizer.lr=0.2"]) is None  # never ran


def test_parse_overrides_types_values():
    params = report.parse_overrides(["optimizer.lr=3e-4", "model.d_model=64", "+x=true", "precision=bf16", "h=[1,2]"])
    assert params == {"optimizer.lr": 3e-4, "model.d_model": 64, "x": True, "precision": "bf16", "h": "[1,2]"}


def test_hparams_session_reads_back_from_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    result = make_job(tmp_path, 0, ["optimizer.lr=0.01", "precision=bf16"], losses=[2.0, 1.0])
    report.write_hparams(tmp_path, result)
    report.write_hparams(tmp_path, result)  # a re-run replaces the session instead of adding one

    log_dir = tmp_path / "tensorboard" / "0"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["optimizer.lr"].number_value == 0.01
    assert session.hparams["precision"].string_value == "bf16"
    assert session.hparams["status"].string_value == "completed"
    assert events.Scalars("final/val/loss")[0].value == 1.0
    assert events.Scalars("best/val/loss")[0].value == 1.0
    assert events.Scalars("steps")[0].value == 2


def test_a_job_with_a_failed_process_is_failed(tmp_path):
    """Two SLURM tasks ran one trial: the one refused wrote its failure, then the one that trained "completed".
    The job is failed whatever its result.json says."""
    make_job(tmp_path, 0, ["seed=0"], losses=[2.0])
    refused = make_job(tmp_path, 1, ["seed=1"], error=RuntimeError("another run holds this run dir"))
    report.write_process_failure(refused)
    make_job_dir = tmp_path / "1"
    completed = report.job_result(make_job_dir, 1, ["seed=1"], "val/loss", "min", 1.0, None, 1.5, "")
    report.write_result(completed)  # the peer that trained ends last, and its result.json says completed
    results = report.write_report(tmp_path, "val/loss", "min")
    assert [(r.job, r.status) for r in results] == [(0, JobStatus.completed), (1, JobStatus.failed)]
    assert results[1].error == "RuntimeError: another run holds this run dir" and results[1].value is None
    markdown = (tmp_path / report.REPORT_MD).read_text()
    assert "2 jobs (1 completed, 1 failed)" in markdown and "Best: job 0" in markdown
    assert report.finished_result(make_job_dir, ["seed=1"]) is None  # resume=auto runs it again
    report.clear_process_failures(make_job_dir)  # what the job's next start does
    assert report.finished_result(make_job_dir, ["seed=1"]).value == 1.0


def test_a_failed_process_alone_is_a_failed_row(tmp_path):
    """The job has no result.json at all, only its process's failure."""
    failure = make_job(tmp_path, 0, ["seed=0"], error=RuntimeError("rank 1 ran out of memory"))
    (tmp_path / "0" / report.RESULT_FILE).unlink()
    report.write_process_failure(failure)
    (result,) = report.write_report(tmp_path, "val/loss", "min")
    assert result.status == JobStatus.failed and result.error == "RuntimeError: rank 1 ran out of memory"
