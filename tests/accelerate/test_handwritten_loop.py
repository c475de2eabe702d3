"""The Accelerator in a user's own loop: the snippet from the README runs unchanged except for the import."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from runner import Accelerator


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    source, targets = torch.randn(64, 8), torch.randint(0, 3, (64,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = DataLoader(TensorDataset(source, targets), batch_size=16, shuffle=False)
    return model, optimizer, data


def _readme_snippet(model, optimizer, data, accelerator):
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for source, targets in data:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(source), targets)
        accelerator.backward(loss)
        optimizer.step()
    return model


def test_readme_loop_matches_a_plain_loop_bitwise():
    model, optimizer, data = _setup()
    trained = _readme_snippet(model, optimizer, data, Accelerator())

    plain, plain_optimizer, plain_data = _setup()
    for source, targets in plain_data:
        plain_optimizer.zero_grad()
        F.cross_entropy(plain(source), targets).backward()
        plain_optimizer.step()

    for ours, theirs in zip(trained.parameters(), plain.parameters()):
        assert torch.equal(ours, theirs)


def test_fp32_prepare_on_cpu_returns_the_same_objects():
    """The model, scheduler and optimizer themselves; the loader is wrapped (gradient_state follows it) and gives
    the same batches."""
    model, optimizer, data = _setup()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    prepared = Accelerator("cpu").prepare(data, model, scheduler, optimizer)
    assert prepared[1] is model and prepared[2] is scheduler and prepared[3] is optimizer
    assert all(torch.equal(a[0], b[0]) for a, b in zip(prepared[0], data)) and len(prepared[0]) == len(data)


def test_the_same_loop_runs_under_fp16_with_a_scaler():
    model, optimizer, data = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    accelerator = Accelerator("cpu", precision="fp16")
    trained = _readme_snippet(model, optimizer, data, accelerator)
    assert accelerator.scaler is not None and accelerator.scaler.is_enabled()
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.parameters()))
    assert all(torch.isfinite(p).all() for p in trained.parameters())


def test_autocast_and_main_process_print(capsys):
    accelerator = Accelerator("cpu", precision="bf16")
    with accelerator.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert accelerator.is_main_process
    accelerator.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"


def test_prepare_model_refuses_what_is_not_a_model():
    import pytest

    with pytest.raises(TypeError, match="prepare_model\\(\\) takes a torch.nn.Module, not a str"):
        Accelerator("cpu").prepare_model("model.pt")
