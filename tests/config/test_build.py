from __future__ import annotations

import datasets
import pytest
import torch

from runner.config.instantiate import build_data, build_model, build_optimizer, build_scheduler, build_task, target_problems
from runner.errors import ConfigError, DataError
from runner.training.tasks import Classification

ALLOWED = ["runner.", "torch."]


def test_target_problems_names_each_bad_key():
    problems = target_problems(
        {
            "model": {"_target_": "runner.models.MLP"},
            "optimizer": {"lr": 0.1},
            "scheduler": None,
            "data": {"_target_": "numpy.load"},
            "task": {"_target_": "torch.nn.NoSuchLoss"},
        },
        ALLOWED,
    )
    assert [str(p) for p in problems] == [
        "optimizer._target_: is missing; set optimizer._target_ to a class or function path",
        "data._target_: 'numpy.load' is not under an allowed module prefix (runner., torch.); add its package "
        "to allowed_targets, e.g. allowed_targets='[runner., torch., numpy.]'",
        "task._target_: cannot import 'torch.nn.NoSuchLoss': torch.nn has no attribute 'NoSuchLoss'",
    ]


def test_target_in_a_missing_module():
    (problem,) = target_problems({"model": {"_target_": "runner.nomodule.Model"}}, ALLOWED)
    assert problem.message == "cannot import 'runner.nomodule.Model': runner has no attribute 'nomodule'"


def test_build_model_optimizer_scheduler():
    model = build_model({"_target_": "runner.models.MLP", "in_features": 4, "out_features": 2, "hidden": [8]})
    assert [type(layer).__name__ for layer in model] == ["Linear", "ReLU", "Linear"]
    optimizer = build_optimizer({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, model)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.5
    scheduler = build_scheduler(
        {"_target_": "runner.schedules.warmup_cosine", "_partial_": True, "warmup_steps": 2}, optimizer, total_steps=10
    )
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[:2] == pytest.approx([0.25, 0.5])  # linear warm-up
    assert lrs[2] == pytest.approx(0.5) and lrs[-1] < 0.05  # then cosine decay toward 0 at total_steps
    # A scheduler that does not take total_steps is called with the optimizer alone.
    step_lr = build_scheduler({"_target_": "torch.optim.lr_scheduler.StepLR", "_partial_": True, "step_size": 3}, optimizer, 10)
    assert step_lr.step_size == 3
    assert build_scheduler(None, optimizer, 10) is None


def test_build_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"model.widht: is not an argument of runner.models.MLP; it takes "
                                          r"in_features, out_features, hidden, dropout"):
        build_model({"_target_": "runner.models.MLP", "in_features": 4, "out_features": 2, "widht": 3})
    with pytest.raises(ConfigError, match="model._target_: built a Adam, not a torch.nn.Module"):
        build_model({"_target_": "torch.optim.Adam", "params": [torch.zeros(1, requires_grad=True)]})


def test_factory_errors_pass_through_unwrapped():
    with pytest.raises(DataError, match="data.train: no such file"):
        build_data({"_target_": "runner.data.local_files", "train": "nope.csv"})


def test_build_data_requires_train_and_validation():
    with pytest.raises(ConfigError, match="returned no validation split"):
        build_data({"_target_": "datasets.DatasetDict", "train": datasets.Dataset.from_dict({"a": [1]})})


def test_build_task():
    task = build_task({"_target_": "runner.tasks.Classification", "input_key": "x", "target_key": "y"})
    assert isinstance(task, Classification) and (task.input_key, task.target_key) == ("x", "y")
