"""The fp16 optimizer wrapper: skips steps with inf/nan gradients, and its step() never reads the scale back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runner.accelerate.accelerator import Accelerator


def _step(accelerator, model, optimizer, value: float) -> None:
    optimizer.zero_grad()
    accelerator.backward(model(torch.full((1, 2), value)).sum())
    optimizer.step()


def test_fp16_reports_skips_without_reading_the_scale(monkeypatch):
    """fp16 steps report skips without reading the scale back each step."""
    # The wrapper alone: an fp32 forward, so the first step's gradient fits fp16 at the initial scale (with the
    # forward in fp16, as prepare() makes it by default, 65536 x 1 overflows and that step is skipped).
    accelerator = Accelerator("cpu", "fp16", autocast_forward=False)
    model = accelerator.prepare(nn.Linear(2, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    assert optimizer.step_was_skipped is False  # nothing stepped yet

    def read_back():  # get_scale() turns the scale into a float: on a GPU, a host-device sync
        raise AssertionError("step() read the scale back")

    monkeypatch.setattr(accelerator.scaler, "get_scale", read_back)
    before = model.weight.detach().clone()
    _step(accelerator, model, optimizer, 1.0)
    assert optimizer.step_was_skipped is False
    assert not torch.equal(model.weight, before)

    before = model.weight.detach().clone()
    _step(accelerator, model, optimizer, float("inf"))
    assert optimizer.step_was_skipped is True
    assert torch.equal(model.weight, before)
    _step(accelerator, model, optimizer, 1.0)
    assert optimizer.step_was_skipped is False


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_other_precisions_return_the_optimizer(precision):
    """Other precisions hand back the optimizer itself, unwrapped."""
    accelerator = Accelerator("cpu", precision)
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    assert accelerator.prepare(optimizer) is optimizer
