"""MetricsLogger: every scalar of a step reaches TensorBoard and metrics.jsonl."""

from __future__ import annotations

from conftest import read_jsonl, read_scalars
from runner.metrics import MetricsLogger


def test_all_scalars_of_a_step_are_read_back(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=True, jsonl=True)
    logger.log(1, {"train/loss": 2.5, "train/lr": 0.001, "train/samples_per_s": 640.0})
    logger.log(2, {"train/loss": 1.5, "train/lr": 0.002, "train/samples_per_s": 650.0})
    logger.log(2, {"val/accuracy": 0.75})
    logger.close()
    assert read_scalars(tmp_path, "train/loss") == [(1, 2.5), (2, 1.5)]
    assert [step for step, _ in read_scalars(tmp_path, "train/lr")] == [1, 2]
    assert read_scalars(tmp_path, "train/samples_per_s") == [(1, 640.0), (2, 650.0)]
    assert read_scalars(tmp_path, "val/accuracy") == [(2, 0.75)]
    assert read_jsonl(tmp_path / "metrics.jsonl")[1] == {"step": 2, "train/loss": 1.5, "train/lr": 0.002,
                                                         "train/samples_per_s": 650.0}
