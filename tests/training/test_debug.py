"""Debug runs (runner/training/debug.py and the limits in runner/training/loop.py): debug=fast writes nothing but its log; the batch
limits; overfit_batches; trainer.deterministic."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import TINY

from runner.commands.cli import main
from runner.config import TrainerConfig
from runner.training.debug import apply_determinism, overfit_splits
from runner.training.loop import planned_steps
from runner.training.batch_plan import BatchPlan


def test_debug_fast_leaves_only_its_log(tmp_path, monkeypatch):
    """debug=fast runs two steps and leaves only its log."""
    monkeypatch.chdir(tmp_path)
    main([*TINY, "debug=fast", "logger=[tensorboard,csv]", "callbacks=[ema]"])
    (run_dir,) = [path.parent for path in (tmp_path / "outputs").rglob("runner.log")]
    # The lock file is how any run holds its dir (runner/run/rundir.py); it is empty.
    assert sorted(path.name for path in run_dir.iterdir()) == [".runner.lock", "runner.log"]
    text = (run_dir / "runner.log").read_text()
    assert "fast_dev_run: 2 train and 2 eval batch(es); no checkpoints, exports, metrics files or loggers" in text
    assert [int(step) for step in re.findall(r"step (\d+): train/loss=", text)] == [1, 2]
    assert len(re.findall(r"step 2: val/loss=[\d.]+, val/accuracy=", text)) == 1  # the loop's line, not the sink's
    assert re.search(r"step 2: val_ema/loss=[\d.]+, val_ema/accuracy=", text)  # EMA's evaluation: the sink's
    assert "schedule: 8 optimizer steps per epoch, 2 in total" in text


def test_debug_fast_saves_no_tokenizer(tmp_path, monkeypatch):
    """The text recipes save their trained tokenizer into the run dir (`${runner.in_run_dir:tokenizer}`); a debug
    run left it there, though it writes nothing but its log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("the cat sat on the mat.\n" * 100)
    main(["recipe=gpt", "data.train=text.txt", "data.block_size=16", "model.n_layer=1", "model.n_head=2",
          "model.n_embd=32", "debug=fast"])
    (run_dir,) = [path.parent for path in (tmp_path / "outputs").rglob("runner.log")]
    assert sorted(path.name for path in run_dir.iterdir()) == [".runner.lock", "runner.log"]
    assert "char tokenizer with 14 ids\n" in (run_dir / "runner.log").read_text()  # trained, not saved


@pytest.mark.parametrize("settings, expected", [
    (dict(max_epochs=2), (10, 20)),
    (dict(max_epochs=2, limit_train_batches=3), (3, 6)),
    (dict(max_epochs=2, limit_train_batches=30), (10, 20)),  # a limit above the split changes nothing
    (dict(max_epochs=2, fast_dev_run=2), (10, 2)),
    (dict(max_epochs=2, max_steps=5, fast_dev_run=3), (10, 3)),
])
def test_train_batch_limits_count_micro_batches(settings, expected):
    """The limits count micro-batches per epoch."""
    assert planned_steps(TrainerConfig(**settings), batches_per_epoch=10, accumulation=1) == expected
    assert planned_steps(TrainerConfig(max_epochs=1, limit_train_batches=4), 10, accumulation=2) == (2, 2)


def test_limit_val_batches_keeps_the_first_batches():
    """Only the first batches are evaluated."""
    from test_loop import _loop

    from runner.training.tasks import Classification

    class Counting(Classification):
        batches = 0

        def evaluation_stats(self, model, batch):
            self.batches += 1
            return super().evaluation_stats(model, batch)

    for limit, expected in ((None, 4), (1, 1)):  # 64 validation rows in batches of 16
        loop, _, _ = _loop(TrainerConfig(limit_val_batches=limit, batch_size=8), task=Counting())
        loop.evaluate_metrics()
        assert loop.task.batches == expected


def test_overfit_batches_reuses_the_first_samples():
    """overfit_batches trains and evaluates on the same first samples."""
    from datasets import Dataset

    splits = {"train": Dataset.from_dict({"x": list(range(100))}), "validation": Dataset.from_dict({"x": [0]})}
    kept = overfit_splits(splits, TrainerConfig(overfit_batches=3), BatchPlan(per_device=4, accumulation=1, processes=2))
    assert kept["train"]["x"] == list(range(24)) and kept["validation"]["x"] == list(range(24))
    assert overfit_splits(splits, TrainerConfig(), BatchPlan(4, 1, 2)) is splits


def test_deterministic_turns_on_torch_determinism(monkeypatch):
    """deterministic=true turns on torch.use_deterministic_algorithms."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        apply_determinism(True)
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
    apply_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_overfit_batches_without_rows_is_refused():
    """overfit_batches on data without rows is refused, naming the key."""
    from runner.data.tokens import TokenStream
    from runner.errors import ConfigError

    stream = TokenStream.__new__(TokenStream)  # a gpt recipe's split: a token stream, not rows
    plan = BatchPlan(per_device=8, accumulation=1, processes=1)
    with pytest.raises(ConfigError, match=r"trainer.overfit_batches: works on row datasets .*TokenStream: a token "
                                          r"stream or padded texts\) has no rows to pick; use trainer.limit_train_batches"):
        overfit_splits({"train": stream, "validation": stream}, TrainerConfig(overfit_batches=2), plan)
