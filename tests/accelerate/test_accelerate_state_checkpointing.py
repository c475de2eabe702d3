"""The behaviours Accelerate's own tests/test_state_checkpointing.py checks (that file is in Accelerate's repository,
not in its wheel, so each check is written again here), run the same way with `accelerate.Accelerator` and with
`runner.Accelerator`, in this process: each check returns what it observed (weights, optimizer state, the
random draws after a resume, the checkpoint folders left), which must be equal for the two and as Accelerate's test
expects. Each runs with safe_serialization True and False (the runner writes safetensors either way). One step
is added to Accelerate's resume checks: every global RNG is moved on before each load_state, so the draws after a
resume match only if the state restored them.

Left out: Accelerate's test_map_location launches its script on a GPU; its CPU part (map_location="cpu",
"on_device", and an invalid one refused) is the last check here.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runner

accelerate = pytest.importorskip("accelerate", reason="the test extra installs accelerate")
import accelerate.utils  # noqa: E402  (its ProjectConfiguration)


class Line(nn.Module):
    """y = a x + b, the two numbers the checks compare."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(1))
        self.b = nn.Parameter(torch.randn(1))

    def forward(self, x):
        return x * self.a + self.b


class Flavour:
    """One library's Accelerator and ProjectConfiguration."""

    def __init__(self, name: str):
        self.name = name
        self.module = accelerate if name == "accelerate" else runner
        self.project_configuration = (accelerate.utils.ProjectConfiguration if name == "accelerate"
                                      else runner.ProjectConfiguration)

    def accelerator(self, project: dict | None = None, **kwargs):
        if project is not None:
            kwargs["project_config"] = self.project_configuration(**project)
        if self.name == "accelerate":
            from accelerate.state import AcceleratorState, GradientState

            AcceleratorState._reset_state(True)  # one Accelerate state a process: start each check afresh
            GradientState._reset_state()
        return self.module.Accelerator(cpu=True, **kwargs)

    def setup(self, project: dict | None = None, scheduler: bool = False, **kwargs):
        """Seeded model, Adam, a shuffled train loader and a valid loader (and StepLR), prepared."""
        seed(42)
        model = Line()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        objects = [model, optimizer, *loaders()]
        if scheduler:
            objects.append(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99))
        accelerator = self.accelerator(project, **kwargs)
        return accelerator, *accelerator.prepare(*objects)


def seed(value: int) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def disturb() -> None:
    """Move every global RNG on, so that only a restored state replays the draws (and the shuffle) after it."""
    random.random(), np.random.rand(), torch.rand(1)


def loaders(batch_size: int = 16, train_batches: int = 10, valid_batches: int = 2):
    def rows(batches: int) -> TensorDataset:
        x = torch.randn(batch_size * batches, 1)
        return TensorDataset(x, 2 * x + 3 + 0.1 * torch.randn(batch_size * batches, 1))

    # (Accelerate's test reads with 4 workers; the order comes from the sampler either way.)
    return (DataLoader(rows(train_batches), shuffle=True, batch_size=batch_size),
            DataLoader(rows(valid_batches), batch_size=batch_size))


def train(epochs: int, model, loader, optimizer, accelerator, scheduler=None) -> list[float]:
    """Train; return one draw of Python's RNG after each epoch (a resume must replay the same draws)."""
    draws = []
    for _ in range(epochs):
        for x, y in loader:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        draws.append(random.random())
        if scheduler is not None:
            scheduler.step()
    return draws


def weights(model) -> tuple[float, float]:
    return model.a.item(), model.b.item()


def adam_state(optimizer) -> dict:
    state = optimizer.state_dict()
    return {"param_groups": state["param_groups"],
            "state": {key: {name: value.tolist() for name, value in entry.items()}
                      for key, entry in state["state"].items()}}


def listing(directory) -> list[str]:
    return sorted(os.listdir(directory))


def resume_check(flavour: Flavour, tmp_path, safe: bool, naming: str) -> dict:
    """Train 3 epochs from a saved start; then from the start again: load it, train 2, save, load that, train 1.
    naming: "folder" (explicit directories), "automatic" (checkpoints/checkpoint_<n>), "relative" (automatic,
    under a relative project_dir, and load_state() finding the newest itself)."""
    project_dir = "relative_project" if naming == "relative" else str(tmp_path / "project")
    project = None if naming == "folder" else {"automatic_checkpoint_naming": True}
    where = {} if naming == "folder" else {"project_dir": project_dir}
    accelerator, model, optimizer, train_loader, _ = flavour.setup(project, **where)
    initial = str(tmp_path / "initial") if naming == "folder" else None
    accelerator.save_state(initial, safe_serialization=safe)
    start, start_adam = weights(model), adam_state(optimizer)
    truth = train(3, model, train_loader, optimizer, accelerator)
    end, end_adam = weights(model), adam_state(optimizer)

    project = None if naming == "folder" else {"automatic_checkpoint_naming": True, "iteration": 1}
    accelerator, model, optimizer, train_loader, _ = flavour.setup(project, **where)
    disturb()
    if naming == "relative":
        accelerator.load_state()
    else:
        accelerator.load_state(initial or os.path.join(project_dir, "checkpoints", "checkpoint_0"))
    loaded, loaded_adam = weights(model), adam_state(optimizer)
    draws = train(2, model, train_loader, optimizer, accelerator)
    middle = str(tmp_path / "checkpoint") if naming == "folder" else None
    accelerator.save_state(middle, safe_serialization=safe)
    disturb()
    accelerator.load_state(middle or os.path.join(project_dir, "checkpoints", "checkpoint_1"))
    draws += train(1, model, train_loader, optimizer, accelerator)
    assert (loaded, loaded_adam) == (start, start_adam) and (weights(model), adam_state(optimizer)) == (end, end_adam)
    assert draws == truth
    saved = [] if naming == "folder" else listing(os.path.join(project_dir, "checkpoints"))
    return {"start": start, "end": end, "draws": draws, "adam": end_adam, "saved": saved}


def check_save_limit(flavour, tmp_path, safe):
    """total_limit=1: two saves leave one checkpoint."""
    accelerator, *_ = flavour.setup({"total_limit": 1, "project_dir": str(tmp_path),
                                     "automatic_checkpoint_naming": True})
    accelerator.save_state(safe_serialization=safe)
    accelerator.save_state(safe_serialization=safe)
    assert listing(os.path.join(tmp_path, "checkpoints")) == ["checkpoint_1"]
    return {"project_dir": listing(tmp_path), "checkpoints": listing(tmp_path / "checkpoints")}


def check_resume_with_folder(flavour, tmp_path, safe):
    return resume_check(flavour, tmp_path, safe, "folder")


def check_resume(flavour, tmp_path, safe):
    return resume_check(flavour, tmp_path, safe, "automatic")


def check_resume_relative_path(flavour, tmp_path, safe):
    return resume_check(flavour, tmp_path, safe, "relative")


def check_invalid_registration(flavour, tmp_path, safe):
    """Objects without state_dict/load_state_dict: ValueError naming each by its index, and only those."""
    model = Line()
    accelerator = flavour.accelerator()
    with pytest.raises(ValueError) as error:
        accelerator.register_for_checkpointing(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4]), model,
                                               torch.optim.Adam(model.parameters()))
    named = [f"Item at index {index}" in str(error.value) for index in range(4)]
    assert named == [True, True, False, False]
    return {"named": named}


def check_with_scheduler(flavour, tmp_path, safe):
    """The scheduler's state is saved and restored."""
    accelerator, model, optimizer, train_loader, _, scheduler = flavour.setup(
        {"automatic_checkpoint_naming": True}, scheduler=True, project_dir=str(tmp_path))
    accelerator.save_state(safe_serialization=safe)
    saved = scheduler.state_dict()
    train(3, model, train_loader, optimizer, accelerator, scheduler)
    trained = scheduler.state_dict()
    accelerator.load_state(os.path.join(tmp_path, "checkpoints", "checkpoint_0"))
    assert trained != saved and scheduler.state_dict() == saved
    return {"saved": saved, "trained": trained}


def check_automatic_loading(flavour, tmp_path, safe):
    """load_state() with no directory loads the newest checkpoint."""
    accelerator, model, optimizer, train_loader, _, scheduler = flavour.setup(
        {"automatic_checkpoint_naming": True}, scheduler=True, project_dir=str(tmp_path))
    accelerator.save_state(safe_serialization=safe)
    train(2, model, train_loader, optimizer, accelerator, scheduler)
    second = weights(model)
    accelerator.save_state(safe_serialization=safe)
    train(1, model, train_loader, optimizer, accelerator, scheduler)
    third = weights(model)
    accelerator.load_state()
    assert weights(model) == second != third
    return {"second": second, "third": third}


def check_checkpoint_deletion(flavour, tmp_path, safe):
    """total_limit=2 over 11 saves keeps the newest two."""
    seed(42)
    accelerator = flavour.accelerator({"automatic_checkpoint_naming": True, "total_limit": 2},
                                      project_dir=str(tmp_path))
    accelerator.prepare(Line())
    for _ in range(11):
        accelerator.save_state(safe_serialization=safe)
    assert listing(tmp_path / "checkpoints") == ["checkpoint_10", "checkpoint_9"]
    return {"checkpoints": listing(tmp_path / "checkpoints")}


def check_map_location(flavour, tmp_path, safe):
    """map_location "cpu" and "on_device" load the optimizer state with its parameters; another is refused."""
    accelerator, model, optimizer, train_loader, _, scheduler = flavour.setup(
        {"automatic_checkpoint_naming": True}, scheduler=True, project_dir=str(tmp_path), mixed_precision="no")
    train(3, model, train_loader, optimizer, accelerator, scheduler)
    accelerator.save_state(safe_serialization=safe)
    devices = []
    for map_location in ("cpu", "on_device"):
        accelerator.load_state(os.path.join(tmp_path, "checkpoints", "checkpoint_0"), map_location=map_location)
        devices.append(str(optimizer.state_dict()["state"][0]["exp_avg"].device))
    with pytest.raises(TypeError, match="Unsupported optimizer map location passed"):
        accelerator.load_state(os.path.join(tmp_path, "checkpoints", "checkpoint_0"), map_location="invalid")
    assert devices == ["cpu", "cpu"]
    return {"devices": devices}


CHECKS = [check_save_limit, check_resume_with_folder, check_resume, check_resume_relative_path,
          check_invalid_registration, check_with_scheduler, check_automatic_loading, check_checkpoint_deletion,
          check_map_location]


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pickle"])
@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__.removeprefix("check_") for check in CHECKS])
def test_state_checkpointing_as_accelerate(tmp_path, monkeypatch, check, safe):
    observed = {}
    for name in ("accelerate", "runner"):
        directory = tmp_path / name
        directory.mkdir()
        monkeypatch.chdir(directory)  # the relative project_dir lands here
        observed[name] = check(Flavour(name), directory, safe)
    assert observed["runner"] == observed["accelerate"]
