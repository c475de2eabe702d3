"""The run dir of a failed start: what this invocation created is removed, except the files its message names."""

from __future__ import annotations

from runner.run import rundir


def test_failed_start_keeps_only_the_named_log(tmp_path):
    """A failed start removes the new run dir but keeps the log named to keep."""
    run_dir = rundir.inspect(tmp_path / "outputs" / "day" / "run")
    (run_dir.path / ".hydra").mkdir()
    (run_dir.path / ".hydra" / "config.yaml").write_text("a: 1\n")
    (run_dir.path / "ranks" / "attempt_0").mkdir(parents=True)
    (run_dir.path / "runner_rank0.log").write_text("rank 0\n")
    (run_dir.path / "runner_rank1.log").write_text("rank 1 failed\n")
    run_dir.remove_what_this_run_created(keep=(run_dir.path / "runner_rank1.log",))
    assert sorted(path.name for path in run_dir.path.iterdir()) == ["runner_rank1.log"]
    assert (run_dir.path / "runner_rank1.log").read_text() == "rank 1 failed\n"
    # What is left is recognised as an earlier run's, so the same command can use the folder again.
    assert rundir.inspect(run_dir.path).state is rundir.RunDirState.runner


def test_failed_start_leaves_no_trace_by_default(tmp_path):
    """Without files to keep, nothing is left."""
    run_dir = rundir.inspect(tmp_path / "outputs" / "day" / "run")
    (run_dir.path / "runner_rank1.log").write_text("rank 1 failed\n")
    run_dir.remove_what_this_run_created()
    assert not (tmp_path / "outputs").exists()


def _failed_run(tmp_path, monkeypatch, err, capsys) -> str:
    """What the CLI prints for `err` in a run dir whose training started (step 8 is its last checkpoint)."""
    import pytest

    import runner.checkpoint
    from runner.commands import cli

    run_dir = rundir.inspect(tmp_path / "run")
    (run_dir.path / "metrics.jsonl").write_text("")
    monkeypatch.setattr(runner.checkpoint, "newest_complete_step", lambda folder: 8)
    with pytest.raises(SystemExit) as ended:
        cli._fail(err, run_dir, multirun=False)
    assert ended.value.code == 1
    return capsys.readouterr().err


def test_unfixable_refusal_does_not_suggest_resume(tmp_path, monkeypatch, capsys):
    """A refusal that resume=auto would repeat does not suggest resume=auto."""
    from runner.errors import LaunchError, ResumeRefused

    refused = ResumeRefused("resume: step_8 was written by a run with 2 process(es) and this run has 1")
    printed = _failed_run(tmp_path, monkeypatch, refused, capsys)
    assert printed == (f"runner: error: {refused}; the last complete checkpoint is step 8, in {tmp_path / 'run'}\n")
    # The same refusal on a rank of a multi-process run reaches the CLI as a LaunchError (runner/launch/launcher.py).
    relayed = LaunchError(f"{refused} (rank 1, before the first optimizer step)")
    relayed.resume_helps = False
    assert "resume=auto" not in _failed_run(tmp_path / "b", monkeypatch, relayed, capsys)


def test_fixable_failure_suggests_resume_auto(tmp_path, monkeypatch, capsys):
    """A failure that resume=auto can get past suggests it."""
    from runner.errors import DiskFull

    printed = _failed_run(tmp_path, monkeypatch, DiskFull("no space left on the disk"), capsys)
    assert printed.endswith("the last complete checkpoint is step 8; continue with the same command plus resume=auto "
                            f"hydra.run.dir={tmp_path / 'run'}\n")


def test_a_bad_setting_in_a_run_dir_with_checkpoints_says_to_fix_it_first(tmp_path, monkeypatch, capsys):
    """`optimizer.lr=abc resume=auto` in a run dir with checkpoints: "continue with the same command plus
    resume=auto" advised the command that had just failed."""
    from runner.errors import ConfigError

    printed = _failed_run(tmp_path, monkeypatch, ConfigError("optimizer.lr", "is 'abc', text"), capsys)
    assert printed == ("runner: error: bad config: optimizer.lr: is 'abc', text; the last complete checkpoint is "
                       f"step 8; with the setting above fixed, resume=auto hydra.run.dir={tmp_path / 'run'} "
                       "continues from it\n")


def test_tampering_and_process_count_are_unfixable(tmp_path):
    """A tampered state and another process count are refusals resume=auto cannot fix."""
    import json

    import pytest
    import torch

    from checkpoint_helpers import NotPlainData, checkpointer_in, save_step, trained_objects
    from runner.checkpoint import MANIFEST, files
    from runner.errors import ResumeRefused
    from runner.training.checkpointer import STATE_FILE, restore

    path = save_step(checkpointer_in(tmp_path), *trained_objects(), step=1)  # written by 1 process
    with pytest.raises(ResumeRefused, match="was written by a run with 1 process") as refused:
        restore(path, trained_objects()[0], world_size=2)
    assert refused.value.resume_helps is False
    torch.save({"loop": NotPlainData()}, path / STATE_FILE)  # altered, then resealed
    manifest = files.read_manifest(path)
    digests = files.block_digests([path / name for name in manifest["files"]])
    manifest["files"] = {name: {"size": (path / name).stat().st_size, "sha256": digests[path / name]}
                         for name in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ResumeRefused, match="cannot be loaded safely") as refused:
        restore(path, trained_objects()[0], world_size=1)
    assert refused.value.resume_helps is False

