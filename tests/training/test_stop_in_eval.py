"""A stop signal during an evaluation (issue 28): the evaluation is abandoned, the step saved, the run exits 75, and
resume=auto evaluates again and ends bitwise where an uninterrupted run ends, with the same log."""

from __future__ import annotations

import pytest

from conftest import CliResult, read_jsonl
from resume_helpers import assert_same_run, run_cli

# 256 rows / 16 per batch = 16 steps per epoch, 2 epochs = 32 steps; evaluations at steps 10, 20, 30 and the final
# one at 32, each of 64 / 16 = 4 batches; a checkpoint every 3 steps (not at 10 or 32).
RUN = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=16", "trainer.eval_batch_size=16",
       "trainer.progress_bar=false", "trainer.max_epochs=2", "trainer.log_every_steps=2",
       "trainer.eval_every_steps=10", "checkpoint.every_n_steps=3",
       "allowed_targets=[runner.,torch.,dist_helpers.]", "task._target_=dist_helpers.SignalDuringEvaluation")
BATCHES_PER_EVALUATION = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reference")
    result = run_cli(*RUN, "hydra.run.dir=run", cwd=cwd)
    assert result.returncode == 0, result.output
    return cwd / "run"


def signalled(*overrides: str, cwd, batch: str) -> CliResult:
    """The run, sent SIGTERM by dist_helpers.SignalDuringEvaluation in evaluation batch `batch` (counted over
    the run; "N:R" signals rank R only)."""
    return run_cli(*RUN, *overrides, "hydra.run.dir=run", cwd=cwd, env={"RUNNER_TEST_SIGNAL_IN_EVAL": batch})


def stopped_in_evaluation(cwd, evaluation: int) -> CliResult:
    """The run, signalled during the 2nd batch of its `evaluation`-th evaluation (seen before the 3rd)."""
    return signalled(cwd=cwd, batch=str((evaluation - 1) * BATCHES_PER_EVALUATION + 2))


@pytest.mark.parametrize("evaluation, step", [(1, 10), (4, 32)], ids=["scheduled-evaluation", "final-evaluation"])
def test_stop_in_eval_saves_then_resumes_exactly(tmp_path, reference, evaluation, step):
    stopped = stopped_in_evaluation(tmp_path, evaluation)
    output = stopped.output
    assert stopped.returncode == 75, output
    assert f"SIGTERM during the evaluation at step {step}: evaluation abandoned after 2 batch(es)" in output
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    # The abandoned evaluation logged nothing: no val/ value at that step.
    assert not [row for row in read_jsonl(run_dir / "metrics.jsonl")
                if row.get("step") == step and any(key.startswith("val/") for key in row)]
    assert not (run_dir / "export" / "final.safetensors").exists()

    resumed = run_cli(*RUN, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert_same_run(run_dir, reference)


def test_two_processes_stop_together_during_evaluation(tmp_path):
    """Only rank 1 gets the signal, in its 2nd evaluation batch; the ranks agree through the stop check before each
    batch they all reach (one MIN of their batch counts per evaluation), so both abandon the evaluation at the same
    batch, save step 10 together, and resume=auto ends where an uninterrupted run ends."""
    # 32 validation rows per rank, 4 batches of 8: the signal comes in batch 2, the check before batch 3 shares it
    # (each check reads the agreement the one before it started), the check before batch 4 acts on it.
    two = ("hardware=multi_cpu", "hardware.num_processes=2", "trainer.eval_batch_size=8")
    reference_cwd = tmp_path / "reference"
    reference_cwd.mkdir()
    result = run_cli(*RUN, *two, "hydra.run.dir=run", cwd=reference_cwd)
    assert result.returncode == 0, result.output
    stopped = signalled(*two, cwd=tmp_path, batch="2:1")
    output = stopped.output
    assert stopped.returncode == 75, output
    assert "during the evaluation at step 10: evaluation abandoned after 3 batch(es)" in output
    resumed = run_cli(*RUN, *two, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert_same_run(tmp_path / "run", reference_cwd / "run")


def test_stop_in_epoch_end_eval_resumes_exactly(tmp_path):
    """Evaluation by epoch (eval_every_steps=null): stopped in the evaluation after epoch 1 (step 16), the resumed
    run evaluates that epoch first, then trains epoch 2."""
    by_epoch = "trainer.eval_every_steps=null"
    reference_cwd = tmp_path / "reference"
    reference_cwd.mkdir()
    result = run_cli(*RUN, by_epoch, "hydra.run.dir=run", cwd=reference_cwd)
    assert result.returncode == 0, result.output
    stopped = signalled(by_epoch, cwd=tmp_path, batch="2")
    assert stopped.returncode == 75, stopped.output
    assert "SIGTERM during the evaluation at step 16" in stopped.output
    resumed = run_cli(*RUN, by_epoch, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert_same_run(tmp_path / "run", reference_cwd / "run")
