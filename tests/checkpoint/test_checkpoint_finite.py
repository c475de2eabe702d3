"""Only finite checkpoints are sealed: NaN or inf in the weights or the optimizer state stops the save with the
non-finite error naming the checkpoint resume=auto will use; a checkpoint marked non-finite is passed over."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from runner.accelerate.accelerator import Accelerator
from runner.checkpoint import MANIFEST, damage, find_resume, read_pointer
from runner.training.checkpointer import Checkpointer, restore, tensors_are_finite
from runner.checkpoint.files import Layout, read_manifest
from runner.config import CheckpointConfig, MonitorMode, TrainerConfig
from runner.data.batches import TensorBatches
from runner.errors import CheckpointError, NonFiniteLoss
from runner.training.loggers import NullLogger
from runner.training.loop import Loop
from runner.training.metrics import Progress
from runner.models import MLP
from runner.training.batch_plan import BatchPlan
from runner.training.tasks import Classification

RESOLVED = {"model": {"_target_": "runner.models.MLP", "in_features": 4, "out_features": 3, "hidden": [8]},
            "seed": 0, "resume": None}


def _objects():
    torch.manual_seed(0)
    model = MLP(4, 3, hidden=[8])
    model.register_buffer("mask", torch.full((2, 2), float("-inf")))  # a legitimate non-finite buffer
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _checkpointer(run_dir, layout=Layout.safetensors, **settings):
    return Checkpointer(run_dir, CheckpointConfig(**settings), writer=True, monitor="val/accuracy",
                        monitor_mode=MonitorMode.max, world_size=1, resolved=RESOLVED, layout=layout)


def _save(checkpointer, model, optimizer, step):
    position = {"step": step, "epoch": 0, "batch_in_epoch": step}
    path = checkpointer.save(model, {"loop": {"step": step}}, position, {}, optimizer=optimizer)
    checkpointer.wait()
    return path


@pytest.mark.parametrize("layout", [Layout.safetensors, Layout.dcp])
@pytest.mark.parametrize("poison", ["weight", "optimizer state"])
def test_nan_state_is_not_sealed_and_names_last_good(tmp_path, layout, poison):
    """NaN in the weights or optimizer state is not sealed, and the error names the last good checkpoint."""
    model, optimizer = _objects()
    checkpointer = _checkpointer(tmp_path, layout)
    first = _save(checkpointer, model, optimizer, step=1)  # the -inf mask buffer does not stop a save
    assert read_manifest(first)["finite"] is True
    with torch.no_grad():
        if poison == "weight":
            model[0].weight[0, 0] = float("nan")
        else:
            optimizer.state[model[0].bias]["exp_avg_sq"][1] = float("inf")
    with pytest.raises(NonFiniteLoss) as caught:
        _save(checkpointer, model, optimizer, step=2)
    assert str(caught.value) == (
        "checkpoint: the weights or optimizer state held NaN or inf after optimizer step 2 (a NaN or inf gradient "
        "can do this while the loss is still finite), so step_00000002 was not saved; resume=auto continues from "
        "step_00000001, the last finite checkpoint. Resuming repeats the same steps, so first lower optimizer.lr, "
        "clip gradients with trainer.max_grad_norm, or set trainer.on_nonfinite=skip to skip steps with "
        "non-finite gradients")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    assert read_pointer(tmp_path / "checkpoints") == "step_00000001"
    assert find_resume("auto", tmp_path) == first


def test_nonfinite_first_save_says_from_scratch(tmp_path):
    """With no checkpoint before it, the message says resume=auto starts from scratch."""
    model, optimizer = _objects()
    with torch.no_grad():
        model[0].weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteLoss, match=r"so step_00000001 was not saved; no checkpoint was saved before it, so "
                                            r"resume=auto starts from scratch\."):
        _save(_checkpointer(tmp_path), model, optimizer, step=1)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_finite_check_covers_every_float_dtype():
    """The check sees NaN and inf of every float dtype, and no large finite value."""
    big = [torch.full((1000,), 300.0, dtype=torch.float16), torch.full((10,), 1e30), torch.full((3,), 3e38), torch.ones(3, dtype=torch.bfloat16)]
    assert tensors_are_finite(big)  # their norms overflow float16, and float32 for 1e30: checked exactly then
    for bad in (float("nan"), float("inf"), float("-inf")):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            assert not tensors_are_finite([*big, torch.tensor([1.0, bad], dtype=dtype)]), (bad, dtype)


def test_resume_auto_passes_over_non_finite_ones(tmp_path, caplog):
    """resume=auto passes over a checkpoint marked non-finite, with a line naming it."""
    model, optimizer = _objects()
    checkpointer = _checkpointer(tmp_path)
    first = _save(checkpointer, model, optimizer, step=1)
    second = _save(checkpointer, model, optimizer, step=2)
    manifest = read_manifest(second)
    (second / MANIFEST).write_text(json.dumps({**manifest, "finite": False}))
    assert damage(second) is None
    with caplog.at_level(logging.WARNING):
        assert find_resume("auto", tmp_path) == first
    assert "resume: passing over checkpoint step_00000002: its manifest says its weights hold NaN or inf" in caplog.text
    with pytest.raises(CheckpointError, match=r"cannot load .*step_00000002: its manifest says its weights hold NaN"):
        find_resume(str(second), tmp_path / "elsewhere")
    del manifest["finite"]  # written before the check: taken as is (see resume.nonfinite_reason)
    (second / MANIFEST).write_text(json.dumps(manifest))
    assert find_resume("auto", tmp_path) == second


class NanGradientAt(Classification):
    """The loss stays finite; at training step `at` (1-based) the first weight's gradient becomes NaN."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls, self.hook = at, 0, None

    def training_loss(self, model, batch):
        self.calls += 1
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if self.calls == self.at:
            self.hook = next(model.parameters()).register_hook(lambda grad: torch.full_like(grad, float("nan")))
        return super().training_loss(model, batch)


def _loop(run_dir, task, max_epochs=2):
    torch.manual_seed(0)
    features = torch.randn(64, 4)
    data = {"features": features, "label": (features[:, 0] > 0).long()}
    model = MLP(4, 2, hidden=[16])
    accelerator = Accelerator("cpu")
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.01))
    settings = TrainerConfig(max_epochs=max_epochs, batch_size=16, log_every_steps=1)
    checkpointer = _checkpointer(run_dir, every_n_steps=2, every_epoch=False, keep_last=None)
    loop = Loop(accelerator, model, optimizer, None, TensorBatches(data, 16, shuffle=True, seed=0),
                TensorBatches(data, 16, shuffle=False, seed=0), task, settings,
                BatchPlan(16, 1, processes=1), logger=NullLogger(), progress=Progress(0, enabled=False),
                checkpointer=checkpointer)
    return loop


def test_nan_gradient_leaves_no_sealed_checkpoint(tmp_path):
    """A NaN gradient with a finite loss leaves no sealed checkpoint; resume=auto takes the one before."""
    task = NanGradientAt(at=6)  # 4 steps an epoch; checkpoints every 2 steps
    loop = _loop(tmp_path, task)
    with pytest.raises(NonFiniteLoss, match=r"after optimizer step 6 .* so step_00000006 was not saved; resume=auto "
                                            r"continues from step_00000004, the last finite checkpoint"):
        loop.fit()
    logged = [value for name, value in loop.step_metrics.items() if name == "train/loss"]
    assert logged and all(math.isfinite(value) for value in logged)  # the loss said nothing was wrong
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_00000002", "step_00000004"]
    chosen = find_resume("auto", tmp_path)
    assert chosen == checkpoints / "step_00000004"
    resumed = _loop(tmp_path, Classification())
    state = restore(chosen, resumed.model, resumed.optimizer, world_size=1)
    assert state["loop"]["step"] == 4
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


def _two_ranks_one_poisoned(run_dir: str) -> dict:
    """Each of 2 gloo processes: save step 1, then rank 1 alone gets an inf in its optimizer state and both save
    step 2 (each rank checks only its own tensors; one all-reduce makes the verdict theirs)."""
    from pathlib import Path

    from runner.distributed.dist import DistInfo, destroy_process_group, init_process_group

    torch.set_num_threads(1)
    info = DistInfo.from_env()
    init_process_group(info, "gloo")
    try:
        model, optimizer = _objects()
        checkpointer = Checkpointer(Path(run_dir), CheckpointConfig(), writer=info.rank == 0, monitor="val/accuracy",
                                    monitor_mode=MonitorMode.max, world_size=2, resolved=RESOLVED)
        _save(checkpointer, model, optimizer, step=1)
        if info.rank == 1:
            optimizer.state[model[0].bias]["exp_avg"][0] = float("inf")
        try:
            _save(checkpointer, model, optimizer, step=2)
        except NonFiniteLoss as err:
            return {"error": str(err)}
        return {"error": None}
    finally:
        destroy_process_group()


def test_ranks_refuse_together_if_one_is_non_finite(tmp_path):
    """Two processes refuse together when one rank holds a non-finite tensor."""
    from dist_workers import launch

    results = launch(_two_ranks_one_poisoned, str(tmp_path))
    assert [results[rank]["error"] is not None for rank in (0, 1)] == [True, True]
    assert "so step_00000002 was not saved; resume=auto continues from step_00000001" in results[0]["error"]
    assert results[0]["error"] == results[1]["error"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]
