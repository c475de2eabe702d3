from __future__ import annotations

import pytest
import torch

from runner.accelerator import Accelerator
from runner.config import TrainerConfig
from runner.data.batches import TensorBatches
from runner.loop import Loop, evaluate, planned_steps
from runner.metrics import NullLogger, Progress
from runner.models import MLP
from runner.tasks import Classification


class RecordingLogger(NullLogger):
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))


class RecordingCheckpointer:
    """The interface the loop uses: cadence questions and save() with plain state dicts."""

    def __init__(self, every_epoch: bool = True):
        self.steps = []
        self.every_epoch = every_epoch
        self.last_path = None

    def due(self, step, evaluated):
        return False

    def save(self, model, state, position, metrics, final=False):
        self.steps.append((position["step"], position["epoch"]))
        return None

    def wait(self):
        pass


def _loop(settings: TrainerConfig, rows: int = 64, every_epoch: bool = True):
    torch.manual_seed(0)
    features = torch.randn(rows, 4)
    data = {"features": features, "label": (features[:, 0] > 0).long()}
    model = MLP(4, 2, hidden=[16])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    accelerator = Accelerator("cpu")
    train = TensorBatches(data, settings.batch_size, shuffle=True, seed=0)
    val = TensorBatches(data, 16, shuffle=False, seed=0)
    logger, checkpointer = RecordingLogger(), RecordingCheckpointer(every_epoch)
    loop = Loop(accelerator, model, optimizer, None, train, val, Classification(), settings, logger,
                Progress(0, enabled=False), checkpointer)
    return loop, logger, checkpointer


def test_planned_steps():
    assert planned_steps(TrainerConfig(max_epochs=3), batches_per_epoch=10) == (10, 30)
    assert planned_steps(TrainerConfig(max_epochs=3, max_steps=12), 10) == (10, 12)
    assert planned_steps(TrainerConfig(max_epochs=2, grad_accum_steps=4), 10) == (2, 4)


def test_fit_logs_evaluates_and_saves_on_cadence():
    loop, logger, checkpointer = _loop(TrainerConfig(max_epochs=2, batch_size=16, log_every_steps=3))
    final = loop.fit()
    train_steps = [step for step, row in logger.rows if "train/loss" in row]
    eval_steps = [step for step, row in logger.rows if "val/accuracy" in row]
    assert train_steps == [3, 6, 8]  # every 3 steps, and the last step
    assert eval_steps == [4, 8]  # end of each epoch (the final one doubles as the run's last)
    assert checkpointer.steps == [(4, 1), (8, 2)]  # end of epoch 1, then the end of the run
    assert final == logger.rows[-1][1]
    assert final["val/accuracy"] > 0.8  # a linearly separable toy problem: it learns


def test_step_budget_and_eval_cadence():
    loop, logger, checkpointer = _loop(TrainerConfig(max_epochs=5, max_steps=5, batch_size=16, eval_every_steps=2))
    loop.fit()
    assert loop.state.step == 5 and loop.state.epoch == 1  # stopped inside the second epoch
    assert [step for step, row in logger.rows if "val/loss" in row] == [2, 4, 5]
    assert checkpointer.steps == [(4, 1), (5, 1)]


def test_logged_loss_is_the_mean_over_the_window():
    loop, logger, _ = _loop(TrainerConfig(max_epochs=1, batch_size=64, log_every_steps=1))
    initial = loop.task.training_loss(loop.model, {"features": loop.train_batches.columns["features"],
                                                   "label": loop.train_batches.columns["label"]}).item()
    loop.fit()
    (step, row), = [(s, r) for s, r in logger.rows if "train/loss" in r]
    assert step == 1 and row["train/loss"] == pytest.approx(initial, rel=1e-5)  # one full batch: its own loss
    assert row["train/lr"] == 0.5 and row["train/samples_per_s"] > 0


def test_gradient_accumulation_steps_once_per_cycle():
    loop, logger, _ = _loop(TrainerConfig(max_epochs=1, batch_size=8, grad_accum_steps=4, log_every_steps=1))
    loop.fit()
    assert loop.state.step == 2  # 8 micro-batches / 4
    assert [step for step, row in logger.rows if "train/loss" in row] == [1, 2]


def test_clipping_logs_the_grad_norm():
    loop, logger, _ = _loop(TrainerConfig(max_epochs=1, batch_size=16, log_every_steps=1, max_grad_norm=0.01))
    loop.fit()
    norms = [row["train/grad_norm"] for _, row in logger.rows if "train/grad_norm" in row]
    assert len(norms) == 4 and all(norm > 0.01 for norm in norms)  # the norm before clipping


def test_evaluate_restores_training_mode():
    loop, _, _ = _loop(TrainerConfig())
    metrics = evaluate(loop.accelerator, loop.model, loop.val_batches, loop.task)
    assert set(metrics) == {"val/loss", "val/accuracy"} and loop.model.training
