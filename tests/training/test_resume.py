"""Exact resume, end to end: `python -m runner` killed (SIGKILL) or stopped (SIGTERM) mid-epoch, then resumed
with resume=auto, must end bitwise where an uninterrupted run ends, having logged the same values."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import read_jsonl, read_scalars
from resume_helpers import RUN, assert_same_rows, assert_same_run, kill_everything, run_cli, start, wait_for_checkpoint
from runner.checkpoint import complete_checkpoints, read_pointer
from runner.data.batches import TensorBatches


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted runs, one per gradient-accumulation setting, computed once for the module."""
    runs = {}
    for accumulate in (1, 2):
        cwd = tmp_path_factory.mktemp(f"reference{accumulate}")
        result = run_cli(*RUN, f"trainer.grad_accum_steps={accumulate}", "hydra.run.dir=run", cwd=cwd)
        assert result.returncode == 0, result.output
        runs[accumulate] = cwd / "run"
    return runs


# SIGKILL wherever the run is (mid-step, mid-save, between micro-batches); SIGTERM asks it to finish the step,
# save and exit 75. Either way resume=auto must end where the uninterrupted run ends.
@pytest.mark.parametrize("accumulate, stop", [(1, signal.SIGKILL), (2, signal.SIGTERM)], ids=["sigkill", "sigterm-accumulating"])
def test_mid_epoch_stop_and_resume_is_bitwise_exact(tmp_path, reference, accumulate, stop):
    """Stopped mid-epoch (SIGKILL, or SIGTERM while accumulating), resume=auto is bitwise exact."""
    run_dir = tmp_path / "run"
    hold_after = 6 if accumulate == 1 else 3
    proc = start(tmp_path, run_dir, hold_after, f"trainer.grad_accum_steps={accumulate}")
    wait_for_checkpoint(tmp_path, run_dir, proc, hold_after)
    if stop == signal.SIGKILL:
        kill_everything(proc)
    else:
        proc.send_signal(signal.SIGTERM)  # ends the hold; the stop is honoured after the step it held in
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 75, output
        assert "stopped by SIGTERM after optimizer step" in output and "resume=auto" in output
        step = int(output.split("stopped by SIGTERM after optimizer step ")[1].split(";")[0])
        assert f"stopped by SIGTERM after optimizer step {step}; saved" in (run_dir / "runner.log").read_text()
        path, manifest = complete_checkpoints(run_dir / "checkpoints")[-1]
        assert manifest["step"] == step and read_pointer(run_dir / "checkpoints") == path.name
    assert not (run_dir / "export" / "final.safetensors").exists(), "the stop came too late to test anything"

    result = run_cli(*RUN, f"trainer.grad_accum_steps={accumulate}", f"hydra.run.dir={run_dir}", "resume=auto",
                     cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert "resumed from" in result.output and "its config.yaml is kept" in result.output
    reference_dir = reference[accumulate]
    assert (run_dir / "config.yaml").read_text() == (reference_dir / "config.yaml").read_text().replace(
        str(reference_dir), str(run_dir))
    assert_same_run(run_dir, reference_dir)


TWO = ("hardware=multi_cpu", "hardware.num_processes=2")


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory) -> Path:
    """An uninterrupted run on 2 processes (DDP), for the DDP resume and for FSDP to be compared with."""
    cwd = tmp_path_factory.mktemp("reference_ddp")
    result = run_cli(*RUN, *TWO, "hydra.run.dir=run", cwd=cwd)
    assert result.returncode == 0, result.output
    return cwd / "run"


def test_2_process_kill_and_resume_is_bitwise_exact(tmp_path, ddp_reference):
    """(Another process count: tests/training/test_resume_world_size.py.)"""
    two, reference = TWO, ddp_reference
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_dir, 3, *two)
    wait_for_checkpoint(tmp_path, run_dir, proc, 3)
    kill_everything(proc)  # the launcher and both workers, as when the node dies
    assert not (run_dir / "export" / "final.safetensors").exists(), "the kill came too late to test anything"

    result = run_cli(*RUN, *two, f"hydra.run.dir={run_dir}", "resume=auto", cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert_same_run(run_dir, reference)
    path, manifest = complete_checkpoints(run_dir / "checkpoints")[-1]
    assert manifest["world_size"] == 2 and len(torch.load(path / "state.pt", weights_only=True)["per_rank"]) == 2


def assert_close_weights(final: dict, expected: dict) -> None:
    """Equal up to float rounding: another process count sums the gradients in another order. Each attention's
    key bias is an exception: softmax ignores a constant added to every key score, so its gradient is rounding
    noise, which AdamW turns into steps of up to lr (4e-5 measured after 13 steps, against 6e-8 elsewhere)."""
    assert final.keys() == expected.keys()
    for name in expected:
        atol = 1e-4 if name.endswith("in_proj_bias") else 1e-6
        torch.testing.assert_close(final[name], expected[name], rtol=1e-5, atol=atol, msg=name)


def assert_same_losses(run_dir: Path, reference: Path, after_step: int = 0) -> None:
    """The train/loss `run_dir` logged after `after_step` (at least 2 values) match `reference`'s at those steps."""
    expected = dict(read_scalars(reference, "train/loss"))
    losses = {step: value for step, value in read_scalars(run_dir, "train/loss") if step > after_step}
    assert len(losses) >= 2 and losses.keys() <= expected.keys(), (sorted(losses), sorted(expected))
    for step, value in losses.items():
        assert value == pytest.approx(expected[step], rel=1e-5), step


def test_fsdp_is_bitwise_like_ddp_and_reshards(tmp_path, tmp_path_factory, reference, ddp_reference):
    """FSDP equals DDP and one process bitwise after kill -9, and reshards 2 to 1 and 1 to 2."""
    # One epoch (16 steps): a checkpoint every 3, killed after one, resumed; then resharded onto one process.
    fsdp = ("hardware=multi_cpu", "hardware.start_method=fork", "parallel=fsdp", "trainer.max_epochs=1",
            "checkpoint.keep_last=null")  # every checkpoint stays: early ones are resumed below
    fsdp_reference = tmp_path_factory.mktemp("reference_fsdp") / "run"
    result = run_cli(*RUN, *fsdp, f"hydra.run.dir={fsdp_reference}", cwd=tmp_path, rows=tmp_path / "reference_rows")
    assert result.returncode == 0, result.output
    assert "fsdp: 2 block(s) and the model sharded over 2 processes (TransformerEncoderLayer)" in result.output
    # The same global batch of 16 each step: sharded, replicated and one process train the same model.
    assert_same_losses(fsdp_reference, reference[1])
    assert_same_losses(fsdp_reference, ddp_reference)

    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_dir, 3, *fsdp)
    killed_at = wait_for_checkpoint(tmp_path, run_dir, proc, 3)
    kill_everything(proc)  # the launcher and both workers, mid-step or mid-write of the shards
    assert not (run_dir / "export" / "final.safetensors").exists(), "the kill came too late to test anything"

    result = run_cli(*RUN, *fsdp, f"hydra.run.dir={run_dir}", "resume=auto", cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert_same_run(run_dir, fsdp_reference)  # export/final.safetensors: the shards gathered into one plain file
    assert set(load_file(run_dir / "export" / "final.safetensors")) == set(
        load_file(reference[1] / "export" / "final.safetensors"))  # the names an unsharded model saves
    path, manifest = complete_checkpoints(run_dir / "checkpoints")[killed_at // 3 - 1]
    assert manifest["layout"] == "dcp" and manifest["world_size"] == 2
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"} <= set(manifest["files"])

    # 2 -> 1: the same checkpoint continues on one process (a new run dir), accumulating two micro-batches of 8,
    # on the same rows in the same order.
    single = tmp_path / "single"
    result = run_cli(*RUN, "parallel=fsdp", "trainer.max_epochs=1", "checkpoint.keep_last=null", f"resume={path}",
                     "trainer.micro_batch_size=8", f"hydra.run.dir={single}", cwd=tmp_path,
                     rows=tmp_path / "single_rows")
    assert result.returncode == 0, result.output
    assert "written by 2 process(es) (8 per device x 1 accumulation step(s)), continued on 1 (8 x 2)" in result.output
    assert_same_rows(tmp_path / "single_rows", 1, tmp_path / "reference_rows", 2, after_step=manifest["step"])
    assert "parallel=fsdp on one process: nothing is sharded; checkpoints are written sharded" in result.output
    assert_close_weights(load_file(single / "export" / "final.safetensors"),
                         load_file(fsdp_reference / "export" / "final.safetensors"))
    assert_same_losses(single, fsdp_reference, after_step=manifest["step"])  # from the checkpoint, not step 0

    # 1 -> 2: a checkpoint that one process wrote continues on two.
    one_path, one_manifest = complete_checkpoints(single / "checkpoints")[0]
    assert one_manifest["layout"] == "dcp" and one_manifest["world_size"] == 1
    assert {".metadata", "__0_0.distcp"} <= set(one_manifest["files"])
    two = tmp_path / "two"
    result = run_cli(*RUN, *fsdp, f"resume={one_path}", f"hydra.run.dir={two}", cwd=tmp_path,
                     rows=tmp_path / "two_rows")
    assert result.returncode == 0, result.output
    assert "written by 1 process(es) (8 per device x 2 accumulation step(s)), continued on 2 (8 x 1)" in result.output
    assert_same_rows(tmp_path / "two_rows", 2, tmp_path / "reference_rows", 2, after_step=one_manifest["step"])
    assert_close_weights(load_file(two / "export" / "final.safetensors"),
                         load_file(fsdp_reference / "export" / "final.safetensors"))
    assert_same_losses(two, fsdp_reference, after_step=one_manifest["step"])


def test_resuming_a_finished_run_does_nothing(tmp_path, reference):
    """It says the run already finished."""
    run_dir = reference[1]
    # Hydra's bookkeeping, the log and the job's result.json (the sweep callback's record) may be rewritten.
    ignored = ("runner.log", "result.json")
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if ".hydra" not in path.parts
              and path.name not in ignored}
    result = run_cli(*RUN, f"hydra.run.dir={run_dir}", "resume=auto", cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert "the run already finished at step 32" in result.output
    after = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if ".hydra" not in path.parts
             and path.name not in ignored}
    assert after == before  # no file written, touched or removed
    final = read_jsonl(run_dir / "metrics.jsonl")[-1]
    assert f"val/accuracy={final['val/accuracy']:.4f}" in result.output


def test_fresh_run_refuses_a_dir_with_checkpoints(tmp_path, reference):
    result = run_cli(*RUN, f"hydra.run.dir={reference[1]}", cwd=tmp_path)
    assert result.returncode == 1
    assert "resume: the run dir" in result.output and "continue it with resume=auto" in result.output


def test_best_export_follows_the_run_dirs_own_evaluations(tmp_path):
    """export/best names the best evaluation in its run dir's metrics.jsonl (as the summary and result.json do):
    continued in place, the best so far comes back with the checkpoint; continued in a new run dir, the new dir's
    best starts with its own evaluations (the first run's best weights are in the first run's export). The
    monitor is val/loss at its max, so the first evaluation stays the best and a later one never beats it;
    keep_best=1 saves after every evaluation, which makes each one a candidate for export/best."""
    monitor = ("trainer.monitor=val/loss", "trainer.monitor_mode=max", "checkpoint.keep_best=1")

    def best_step(run_dir: Path) -> int:
        rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if "val/loss" in row]
        return max(rows, key=lambda row: row["val/loss"])["step"]

    first = run_cli(*RUN, *monitor, "trainer.max_steps=12", "hydra.run.dir=first", cwd=tmp_path)
    assert first.returncode == 0, first.output
    continued = run_cli(*RUN, *monitor, "trainer.max_steps=24", f"resume={tmp_path / 'first'}",
                        "hydra.run.dir=second", cwd=tmp_path)
    assert continued.returncode == 0, continued.output
    in_place = run_cli(*RUN, *monitor, "trainer.max_steps=24", "resume=auto", "hydra.run.dir=first", cwd=tmp_path)
    assert in_place.returncode == 0, in_place.output
    for name, after in (("first", 0), ("second", 12)):
        best = json.loads((tmp_path / name / "export" / "best.json").read_text())
        assert best["step"] == best_step(tmp_path / name) and best["step"] > after, (name, best)
    # The premise: the loss falls, so the in-place run's best is still one of the first invocation's evaluations
    # (had the best not come back with the checkpoint, its step 20 would have been exported as the best).
    assert best_step(tmp_path / "first") <= 12
    assert "this run dir's best starts with this run's evaluations" in continued.output


def test_batches_can_start_inside_an_epoch():
    data = {"x": torch.arange(20)}
    whole = TensorBatches(data, batch_size=3, shuffle=True, seed=5)
    whole.set_epoch(2)
    every = [batch["x"] for batch in whole]
    whole.set_epoch(2, start=4)
    tail = [batch["x"] for batch in whole]
    assert len(tail) == len(every) - 4 == 3 and all(torch.equal(a, b) for a, b in zip(tail, every[4:]))
    whole.set_epoch(3)  # the next epoch starts at its beginning again
    assert len(list(whole)) == 7
