from __future__ import annotations

import pytest
import torch

from runner.accelerate.accelerator import Accelerator
from runner.config import TrainerConfig
from runner.errors import NonFiniteLoss
from runner.data.batches import TensorBatches
from runner.training.loop import Loop, evaluate, planned_steps
from runner.training.batch_plan import BatchPlan
from runner.training.loggers import NullLogger
from runner.training.metrics import Progress
from runner.models import MLP
from runner.training.tasks import Classification


class RecordingLogger(NullLogger):
    def __init__(self):
        self.rows = []

    def log(self, step, metrics):
        self.rows.append((step, dict(metrics)))


class RecordingCheckpointer:
    """The interface the loop uses: cadence questions and save() with plain state dicts."""

    enabled = True

    def __init__(self, every_epoch: bool = True):
        self.steps = []
        self.every_epoch = every_epoch
        self.last_path = None

    def due(self, step, evaluated):
        return False

    def save(self, model, state, position, metrics, final=False, optimizer=None):
        self.steps.append((position["step"], position["epoch"]))
        return None

    def wait(self):
        pass

    def settle_after_interrupt(self):
        self.steps.append("settled")


def _loop(settings: TrainerConfig, rows: int = 64, every_epoch: bool = True, task=None, precision="fp32",
          lr: float = 0.5):
    torch.manual_seed(0)
    features = torch.randn(rows, 4)
    data = {"features": features, "label": (features[:, 0] > 0).long()}
    model = MLP(4, 2, hidden=[16])
    accelerator = Accelerator("cpu", precision=precision)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=lr))
    train = TensorBatches(data, settings.batch_size, shuffle=True, seed=0)
    val = TensorBatches(data, 16, shuffle=False, seed=0)
    logger, checkpointer = RecordingLogger(), RecordingCheckpointer(every_epoch)
    batch = BatchPlan(settings.batch_size, settings.grad_accum_steps or 1, processes=1)
    loop = Loop(accelerator, model, optimizer, None, train, val, task or Classification(), settings, batch,
                logger=logger, progress=Progress(0, enabled=False), checkpointer=checkpointer)
    return loop, logger, checkpointer


class LossBecomesInfinite(Classification):
    """A task whose loss is inf from training step `at` on (1-based), as a diverging run's would be."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def training_loss(self, model, batch):
        self.calls += 1
        loss = super().training_loss(model, batch)
        return loss * float("inf") if self.calls >= self.at else loss


def test_non_finite_loss_stops_without_saving():
    """The run stops at the next log step, without saving it."""
    loop, logger, checkpointer = _loop(TrainerConfig(max_epochs=3, batch_size=16, log_every_steps=2),
                                       task=LossBecomesInfinite(at=4), every_epoch=True)
    with pytest.raises(NonFiniteLoss, match=r"the training loss became (inf|nan) by optimizer step 4 \(the last "
                                            r"finite train/loss was [\d.]+ at step 2\)"):
        loop.fit()
    assert checkpointer.steps == []  # the epoch-end save (step 4) never saw the poisoned window
    assert [step for step, row in logger.rows if "train/loss" in row] == [2]


def test_on_nonfinite_skip_skips_and_counts_steps(caplog):
    """Skipped steps are counted in train/skipped_steps, and said: at the first, and their number at the end."""
    loop, logger, _ = _loop(TrainerConfig(max_epochs=1, batch_size=16, log_every_steps=4, on_nonfinite="skip"),
                            task=LossBecomesInfinite(at=3))
    before = [p.detach().clone() for p in loop.model.parameters()]
    with caplog.at_level("WARNING"):
        loop.fit()
    assert caplog.text.count("non-finite gradients, the step is skipped") == 1 and "step 3: " in caplog.text
    assert "trainer.on_nonfinite=skip skipped 2 optimizer step(s) with non-finite gradients" in caplog.text
    (_, row), = [(step, row) for step, row in logger.rows if "train/loss" in row]
    assert row["train/skipped_steps"] == 2.0 and row["train/loss"] > 0  # steps 3 and 4 of 4; the loss of 1 and 2
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, loop.model.parameters()))  # steps 1 and 2 happened


def test_fp16_scaler_skipped_steps_are_no_error():
    """An inf loss under fp16 gives inf gradients: the grad scaler skips the step, the weights stay finite."""

    class OneInfiniteLoss(Classification):
        calls = 0

        def training_loss(self, model, batch):
            OneInfiniteLoss.calls += 1
            loss = super().training_loss(model, batch)
            return loss * float("inf") if OneInfiniteLoss.calls == 2 else loss

    loop, logger, _ = _loop(TrainerConfig(max_epochs=1, batch_size=16, log_every_steps=4), task=OneInfiniteLoss(),
                            precision="fp16")
    loop.fit()
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())
    assert loop.state.step == 4


def test_planned_steps():
    assert planned_steps(TrainerConfig(max_epochs=3), batches_per_epoch=10, accumulation=1) == (10, 30)
    assert planned_steps(TrainerConfig(max_epochs=3, max_steps=12), 10, 1) == (10, 12)
    assert planned_steps(TrainerConfig(max_epochs=2), 10, accumulation=4) == (2, 4)


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
    assert set(metrics) == {"val/loss", "val/accuracy", "val/macro_f1"} and loop.model.training


class InterruptedAt(LossBecomesInfinite):
    """Ctrl-C during training step `at` (1-based), before its loss would turn infinite."""

    def training_loss(self, model, batch):
        if self.calls + 1 >= self.at:
            raise KeyboardInterrupt
        return super().training_loss(model, batch)


def test_ctrl_c_lets_a_seal_under_way_finish_first():
    """The loop waits for a checkpoint being sealed before Ctrl-C goes up to the message that names the newest one
    (Checkpointer.settle_after_interrupt: the checkpointer double records the call)."""
    loop, _, checkpointer = _loop(TrainerConfig(max_epochs=3, batch_size=16), task=InterruptedAt(at=6))
    with pytest.raises(KeyboardInterrupt):
        loop.fit()
    assert checkpointer.steps[-1] == "settled"
