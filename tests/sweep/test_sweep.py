"""End-to-end sweeps: `python -m runner -m ...` grids, Optuna searches, the joblib and submitit launchers, failures,
re-runs, and the report each sweep leaves at its root."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from conftest import TINY, read_scalars, run_cli

FAST = (*TINY, "trainer.max_steps=2")


def sweep_dirs(result) -> list:
    return sorted(path.parent for path in (result.cwd / "outputs").rglob("sweep_report.csv"))


def report_rows(sweep_dir) -> list[dict]:
    with open(sweep_dir / "sweep_report.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_grid_runs_every_combination_and_ranks_them(cli):
    result = cli("-m", *FAST, "optimizer.lr=1e-3,3e-4", "precision=fp32,bf16",
                 "trainer.monitor=val/loss", "trainer.monitor_mode=min")
    assert result.returncode == 0, result.output
    (sweep,) = sweep_dirs(result)
    job_dirs = sorted(path for path in sweep.iterdir() if path.name.isdigit())
    assert [path.name for path in job_dirs] == ["0", "1", "2", "3"]

    # Each job's own TensorBoard run is the independent record the report must agree with.
    final_loss = {int(path.name): read_scalars(path, "val/loss")[-1][1] for path in job_dirs}
    rows = report_rows(sweep)
    assert len(rows) == 4
    assert [int(row["job"]) for row in rows] == sorted(final_loss, key=lambda job: (final_loss[job], job))
    assert [float(row["val/loss"]) for row in rows] == pytest.approx(sorted(final_loss.values()))
    assert [row["best"] for row in rows] == ["True", "False", "False", "False"]
    assert {(float(row["optimizer.lr"]), row["precision"]) for row in rows} == {
        (1e-3, "fp32"), (1e-3, "bf16"), (3e-4, "fp32"), (3e-4, "bf16")}
    assert all(row["status"] == "completed" and row["steps"] == "2" and float(row["wall_time_s"]) > 0 for row in rows)

    for path in job_dirs:
        saved = json.loads((path / "result.json").read_text())
        assert saved["value"] == pytest.approx(final_loss[int(path.name)])  # what the job returned to Hydra
    markdown = (sweep / "sweep_report.md").read_text()
    assert "4 jobs (4 completed), sorted by val/loss (min), best first." in markdown
    assert f"| **1 (best)** | {rows[0]['job']} | completed |" in markdown
    assert sorted(path.name for path in (sweep / "tensorboard").iterdir()) == ["0", "1", "2", "3"]


def test_a_failing_trial_does_not_stop_the_sweep(cli):
    """The failed trial is recorded in the report; a rerun with resume=auto skips the finished jobs."""
    sweep = "outputs/multirun/fixed"
    # nhead=4 does not divide 30: job 0 fails while building its model; job 1 still runs.
    first = cli("-m", *FAST, "model.d_model=30,32", f"hydra.sweep.dir={sweep}")
    assert first.returncode == 1, first.output  # Hydra's basic sweeper exits 1 after the last job when one failed
    error = "bad config: model.nhead: is 4, which does not divide model.d_model=30"
    assert f"runner: error: {error}" in first.stderr
    sweep_dir = first.cwd / sweep
    rows = report_rows(sweep_dir)
    assert [(row["job"], row["status"], row["model.d_model"]) for row in rows] == [
        ("1", "completed", "32"), ("0", "failed", "30")]
    assert rows[0]["best"] == "True" and rows[1]["error"].startswith(f"ConfigError: {error}")
    assert (sweep_dir / "0" / ".hydra" / "overrides.yaml").is_file()  # the failed job's dir is kept
    finished = (sweep_dir / "1" / "result.json").read_bytes()
    checkpoint = sweep_dir / "1" / "checkpoints" / "step_00000002" / "state.pt"
    written_at = checkpoint.stat().st_mtime_ns

    again = cli("-m", *FAST, "model.d_model=30,32", f"hydra.sweep.dir={sweep}", "resume=auto")
    assert again.returncode == 1, again.output
    assert f"resume=auto: {sweep_dir / '1'} already finished with val/accuracy=" in again.output
    assert again.output.count("runner: error: bad config: model") == 1  # the failed job ran again
    assert (sweep_dir / "1" / "result.json").read_bytes() == finished
    assert checkpoint.stat().st_mtime_ns == written_at
    rows = report_rows(sweep_dir)
    assert [(row["job"], row["status"]) for row in rows] == [("1", "completed"), ("0", "failed")]

    # Another sweep into the same dir: each job dir holds another experiment, which is neither continued nor
    # credited to the new job, and whose record stays (result.json used to be overwritten with the new overrides).
    other = cli("-m", *FAST, "model.d_model=48,64", f"hydra.sweep.dir={sweep}", "resume=auto")
    assert other.returncode == 1, other.output
    assert (f"runner: error: bad config: hydra.sweep.dir: {sweep_dir / '1'} holds job 1 of an earlier sweep with "
            "other overrides (") in other.stderr and "give this one a new hydra.sweep.dir" in other.stderr
    assert "resumed from" not in other.output and "continue with the same command" not in other.output
    assert (sweep_dir / "1" / "result.json").read_bytes() == finished
    assert report_rows(sweep_dir) == rows


@pytest.mark.slow
def test_optuna_runs_trials_and_resumes_its_study(cli):
    import optuna  # the test extra installs the sweeps extra
    search = (*FAST, "hparams_search=lr_width", "hydra.sweeper.n_trials=3")
    first = cli(*search)
    assert first.returncode == 0, first.output
    (sweep,) = sweep_dirs(first)
    rows = report_rows(sweep)
    assert len(rows) == 3 and all(row["status"] == "completed" for row in rows)
    values = [float(row["val/accuracy"]) for row in rows]
    assert values == sorted(values, reverse=True)  # val/accuracy is maximized
    for row in rows:
        assert 1e-4 <= float(row["optimizer.lr"]) <= 1e-2 and row["model.d_model"] in {"32", "64", "128"}
        # Sampled once, in the parent, and handed down: the job ran with exactly the reported values.
        config = yaml.safe_load((sweep / row["job"] / "config.yaml").read_text())
        assert config["model"]["d_model"] == int(row["model.d_model"])
        assert config["optimizer"]["lr"] == pytest.approx(float(row["optimizer.lr"]))
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(values))

    # Run the same search again: the study continues. nhead=5 divides no width, so this trial fails: it is
    # recorded (report, study) and, with max_failure_rate=1.0, the search still exits cleanly.
    second = cli(*FAST, "hparams_search=lr_width", "hydra.sweeper.n_trials=1", "model.nhead=5")
    assert second.returncode == 0, second.output
    assert "Using an existing study with name 'lr_width'" in second.output
    newer = [path for path in sweep_dirs(second) if path != sweep]
    (row,) = report_rows(newer[0])
    assert row["status"] == "failed" and "model.nhead: is 5, which does not divide model.d_model=32" in row["error"]
    study = optuna.load_study(study_name="lr_width", storage=f"sqlite:///{first.cwd}/outputs/optuna/lr_width.db")
    states = [trial.state.name for trial in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL"]
    # The sampler's seed counts the study's trials: the continued search drew a new value, not its first trial's.
    assert study.trials[3].params["optimizer.lr"] not in [trial.params["optimizer.lr"] for trial in study.trials[:3]]
    assert sorted(trial.value for trial in study.trials[:3]) == pytest.approx(sorted(values))


def test_a_stopped_sweep_job_says_how_to_continue_the_sweep(cli, tmp_path):
    """A stop signal in a sweep's job: the advice is the sweep's (hydra.sweep.dir), not hydra.run.dir, which -m
    ignores."""
    (tmp_path / "stopper.py").write_text(
        "import os, signal\nfrom runner.training.callbacks import Callback\n\n\nclass TermAtStep2(Callback):\n"
        "    def on_step_end(self, loop):\n        if loop.state.step == 2:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n")
    sweep = tmp_path / "sweep"
    result = cli("-m", *TINY, "trainer.max_steps=6", "optimizer.lr=1e-3", "+callbacks.stop._target_=stopper.TermAtStep2",
                 "allowed_targets=[runner.,torch.,datasets.,stopper.]", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 75, result.output
    assert (f"runner: stopped by SIGTERM after optimizer step 2; saved {sweep / '0' / 'checkpoints'}" in result.output
            and f"; continue the sweep with the same command plus resume=auto hydra.sweep.dir={sweep}"
            in result.output), result.output


def test_a_search_in_which_every_trial_failed_ends_in_one_paragraph(cli):
    """Optuna asks the study for its best trial after the last one; a new study that holds only failed trials has
    none, which the plugin met with "ValueError: Record does not exist" and a traceback."""
    result = cli(*FAST, "hparams_search=lr_width", "hydra.sweeper.n_trials=2", "model.nhead=5")
    assert result.returncode == 1, result.output
    (sweep,) = sweep_dirs(result)
    assert (f"every one of the 2 trials of the search failed, so study 'lr_width' has no best trial and the search "
            f"has no result; each trial's error is in {sweep.relative_to(result.cwd) / 'sweep_report.md'}"
            in result.output)
    assert "Traceback" not in result.output and "Record does not exist" not in result.output
    rows = report_rows(sweep)
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert all("model.nhead: is 5, which does not divide" in row["error"] for row in rows)


@pytest.mark.slow
def test_joblib_runs_jobs_in_parallel_processes(cli):
    """Two jobs, hardware=cpu and multi_cpu (whose ranks start from inside a loky worker)."""
    result = cli("-m", *FAST, "hydra/launcher=parallel", "hardware=cpu,multi_cpu")
    assert result.returncode == 0, result.output
    assert "Joblib.Parallel(n_jobs=2" in result.output
    (sweep,) = sweep_dirs(result)
    rows = {row["hardware"]: row for row in report_rows(sweep)}
    assert set(rows) == {"cpu", "multi_cpu"}
    assert all(row["status"] == "completed" and row["steps"] == "2" for row in rows.values())
    multi = sweep / rows["multi_cpu"]["job"]
    assert (multi / "runner_rank1.log").is_file()  # two ranks, started from inside a loky worker


@pytest.mark.slow
def test_submitit_local_runs_the_slurm_code_path(cli):
    """Its jobs print into submitit's log files: the launching process's line for a failed job carries the error
    (it said "its error is above", where it was not)."""
    result = cli("-m", *FAST, "hydra/launcher=slurm_local", "optimizer.lr=1e-3,abc")
    assert result.returncode == 1, result.output
    assert ("job 1 failed (its error: bad config: optimizer.lr: is 'abc', text where torch.optim.AdamW takes a "
            "number") in result.output
    (sweep,) = sweep_dirs(result)
    rows = report_rows(sweep)
    assert [(row["optimizer.lr"], row["status"]) for row in rows] == [("0.001", "completed"), ("abc", "failed")]
    assert list((sweep / ".submitit").glob("*/*_log.out"))  # submitit's own per-job logs


def test_slurm_launcher_and_search_compose(cli):
    result = cli("hparams_search=lr_width", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                 "hydra.launcher.gpus_per_node=4", "hardware=multi_gpu", "hardware.num_processes=4", "--cfg", "hydra")
    assert result.returncode == 0, result.output
    hydra_cfg = yaml.safe_load(result.stdout)["hydra"]
    launcher, sweeper = hydra_cfg["launcher"], hydra_cfg["sweeper"]
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher["partition"], launcher["gpus_per_node"], launcher["tasks_per_node"]) == ("gpu", 4, 1)
    assert sweeper["_target_"] == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweeper["storage"] == "sqlite:///outputs/optuna/${hydra.sweeper.study_name}.db"
    assert sweeper["params"] == {"optimizer.lr": "tag(log, interval(1.0e-4, 1.0e-2))",
                                 "model.d_model": "choice(32, 64, 128)"}
    assert hydra_cfg["callbacks"]["sweep_report"]["_target_"] == "runner.sweep.SweepReport"


@pytest.mark.parametrize(("mode", "direction"), [("max", "maximize"), ("min", "minimize")])
def test_search_direction_follows_the_monitor_mode(mode, direction):
    from hydra import compose, initialize_config_dir

    from runner.run.compose import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["hparams_search=lr_width", f"trainer.monitor_mode={mode}"],
                      return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == direction
    assert cfg.hydra.sweeper.max_failure_rate == 1.0


def test_a_search_under_torchrun_is_refused(tmp_path):
    result = run_cli(*FAST, "hparams_search=lr_width", cwd=tmp_path,
                     args=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"))
    assert result.returncode != 0
    message = "runner: error: hydra.sweeper: a search (OptunaSweeper) cannot run under torchrun"
    # Each rank refuses before sampling anything; the first to exit makes torchrun SIGTERM the other, which may not
    # have printed yet (more so since a runner process exits at once, runner/launch/shutdown.py).
    assert result.output.count(message) >= 1, result.output
    assert "each rank would sample its own hyperparameters" in result.output
    written = sorted(str(path.relative_to(tmp_path)) for path in (tmp_path / "outputs").rglob("*"))
    assert written == [], written  # refused before Hydra made a run dir, a sweep dir or the study's storage


def _job_config(tmp_path, job: int) -> "object":
    """The config a sweep job's callback receives, as far as the sweep callback reads it."""
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "trainer": {"monitor": "val/loss", "monitor_mode": "min", "fast_dev_run": None},
        "hardware": {"machine_rank": 0}, "resume": None,
        "hydra": {"mode": "MULTIRUN", "sweep": {"dir": "sweep"},
                  "runtime": {"output_dir": str(tmp_path / "sweep" / str(job)), "cwd": str(tmp_path)},
                  "job": {"num": job}, "overrides": {"task": [f"seed={job}"]}},
    })


def test_one_failed_rank_fails_the_whole_job(tmp_path, monkeypatch):
    """Even though rank 0, which owns result.json, completed."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from runner.sweep.callback import SweepReport

    config = _job_config(tmp_path, 0)
    config.hydra.mode = RunMode.MULTIRUN
    (tmp_path / "sweep" / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    monkeypatch.setenv("RANK", "1")  # torchrun's rank 1: it does not own result.json
    rank1 = SweepReport()
    rank1.on_job_start(config)
    failed = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("rank 1: CUDA out of memory"))
    rank1.on_job_end(config, failed)
    monkeypatch.setenv("RANK", "0")
    rank0 = SweepReport()
    rank0.on_job_end(config, JobReturn(status=JobStatus.COMPLETED, _return_value=0.5))
    assert json.loads((tmp_path / "sweep" / "0" / "result.json").read_text())["status"] == "completed"
    (row,) = report_rows(tmp_path / "sweep")
    assert row["status"] == "failed" and row["error"] == "RuntimeError: rank 1: CUDA out of memory"


def test_a_study_made_in_the_other_direction_is_named(tmp_path, monkeypatch, capsys):
    """Continuing a study made to minimize with a search that maximizes: one paragraph before any trial, not
    Optuna's traceback once the sweep has started."""
    import optuna

    from runner.commands.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "optuna").mkdir(parents=True)
    optuna.create_study(study_name="mine", storage="sqlite:///outputs/optuna/mine.db", direction="minimize")
    with pytest.raises(SystemExit) as exit_info:
        main([*FAST, "hparams_search=lr_width", "hydra.sweeper.study_name=mine"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err
    assert ("runner: error: bad config: hydra.sweeper.study_name: study 'mine' in sqlite:///outputs/optuna/mine.db "
            "was made to minimize, and this search would maximize val/accuracy (trainer.monitor_mode=max)") in err
    assert not any((tmp_path / "outputs").glob("multirun"))
