"""Resuming on another number of processes: `python -m runner` checkpoints on N processes and continues on M. With
the same global batch, the steps after the resume take the same rows in the same order as the uninterrupted run
(recorded per rank by dist_helpers.HoldAfterCheckpoint, rebuilt per global batch) and end on the same weights up
to float rounding; what cannot continue exactly is refused before training, named."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import run_cli as run_cli_with
from resume_helpers import HELPERS_ENV, RUN, assert_same_rows, run_cli
from runner.checkpoint import complete_checkpoints
from test_resume import assert_close_weights, assert_same_losses

KEEP_ALL = "checkpoint.keep_last=null"  # every checkpoint stays: a middle one is resumed


def processes(count: int) -> tuple[str, ...]:
    return ("hardware=multi_cpu", f"hardware.num_processes={count}") if count > 1 else ()


def run(cwd: Path, name: str, *overrides: str) -> Path:
    """One run in cwd/<name>, recording the rows of every micro-batch in cwd/<name>_rows; returns the run dir."""
    result = run_cli(*RUN, KEEP_ALL, f"hydra.run.dir={name}", *overrides, cwd=cwd, rows=cwd / f"{name}_rows")
    assert result.returncode == 0, result.output
    (cwd / name / "output.txt").write_text(result.output)
    return cwd / name


def checkpoint_at(run_dir: Path, step: int) -> tuple[Path, dict]:
    return next((path, manifest) for path, manifest in complete_checkpoints(run_dir / "checkpoints")
                if manifest["step"] == step)


def assert_continues(resumed: Path, count: int, reference: Path, reference_count: int,
                     after_step: int) -> tuple[float, float]:
    """The global batches after `after_step` are the reference's, row for row; the final weights and losses match
    up to float rounding. Returns the largest weight difference, and the largest but the attention key biases'
    (docs/checkpoints.md reports them)."""
    assert_same_rows(resumed.parent / f"{resumed.name}_rows", count, reference.parent / f"{reference.name}_rows",
                     reference_count, after_step)
    final = load_file(resumed / "export" / "final.safetensors")
    wanted = load_file(reference / "export" / "final.safetensors")
    assert_close_weights(final, wanted)
    assert_same_losses(resumed, reference, after_step=after_step)
    differences = {name: float((final[name] - wanted[name]).abs().max()) for name in wanted}
    return max(differences.values()), max(value for name, value in differences.items()
                                          if not name.endswith("in_proj_bias"))


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    """An uninterrupted run on 2 processes, 8 samples per device (32 steps over 2 epochs of 16)."""
    return run(tmp_path_factory.mktemp("world"), "two", *processes(2))


def test_ddp_2_to_1_and_4_continues_with_the_same_rows(two, tmp_path):
    """Step 21 (epoch 1, 5 steps in) continues on 1 process, accumulating 4 micro-batches of 4 (what one device of
    4 rows could hold), and on 4 processes of 4 rows each."""
    path, manifest = checkpoint_at(two, 21)
    assert (manifest["world_size"], manifest["epoch"], manifest["samples_in_epoch"], manifest["global_batch"]) == \
        (2, 1, 80, 16)
    one = run(tmp_path, "one", "trainer.micro_batch_size=4", f"resume={path}")
    output = (one / "output.txt").read_text()
    assert ("resume: written by 2 process(es) (8 per device x 1 accumulation step(s)), continued on 1 (4 x 4): the "
            "global batch of 16 is the same, so training goes on from sample 80 of epoch 1") in output
    assert "no longer an exact continuation" not in output  # hardware and micro-batches are not the experiment
    differences = {"2->1": assert_continues(one, 1, two, 2, after_step=21)}
    four = run(tmp_path, "four", *processes(4), f"resume={path}")
    assert "continued on 4 (4 x 1)" in (four / "output.txt").read_text()
    differences["2->4"] = assert_continues(four, 4, two, 2, after_step=21)
    print("largest weight difference against the uninterrupted run:", differences)


def test_ddp_1_to_2_continues_with_the_same_rows(tmp_path):
    """A checkpoint one process wrote mid-epoch continues on two."""
    one = run(tmp_path, "one")
    path, manifest = checkpoint_at(one, 9)
    two = run(tmp_path, "two", *processes(2), f"resume={path}")
    assert "written by 1 process(es) (16 per device x 1 accumulation step(s)), continued on 2 (8 x 1)" in \
        (two / "output.txt").read_text()
    print("largest weight difference, 1->2:", assert_continues(two, 2, one, 1, after_step=9))


def test_another_global_batch_is_refused_before_training(two, tmp_path):
    """Per-device batches on another process count make another global batch: refused in the parent, named."""
    path, _ = checkpoint_at(two, 21)
    result = run_cli_with(*RUN, "trainer.per_device_batch_size=8", f"resume={path}", "hydra.run.dir=other",
                          cwd=tmp_path, env=HELPERS_ENV)
    assert result.returncode == 1
    assert ("was written with a global batch of 16 samples per optimizer step on 2 process(es); this run has 1 and a "
            "global batch of 8") in result.output and "trainer.batch_size=16" in result.output
    assert not (tmp_path / "other" / "checkpoints").exists()  # nothing trained or written


def test_another_number_of_steps_per_epoch_is_refused(two, tmp_path):
    """The checkpoint's run took 16 steps an epoch on 2 processes; with 264 rows one process takes 17 (the last,
    partial one smaller), so the steps and the schedule could not be the uninterrupted run's: refused, named."""
    path, _ = checkpoint_at(two, 21)
    result = run_cli_with(*RUN, "data.num_train=264", f"resume={path}", "hydra.run.dir=other", cwd=tmp_path,
                          env=HELPERS_ENV)
    assert result.returncode == 1
    assert ("the checkpoint's run took 16 optimizer steps per epoch on 2 process(es), and this run's split of the "
            "same global batch takes 17") in result.output and "Resume with hardware.num_processes=2" in result.output
    assert "Traceback" not in result.output
