"""Precision: autocast dtypes, the scaler, fp8 conversion, and what each device lacks (CUDA stood in for on CPU)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from runner.accelerate import precision as precision_module
from runner.config import PrecisionKind
from runner.accelerate.precision import Precision, fp8_eligible, precision_problems


@pytest.mark.parametrize("kind, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_linear_in_the_precision_dtype(kind, dtype):
    layer = nn.Linear(4, 4)
    with Precision(kind, "cpu").autocast():
        assert layer(torch.ones(2, 4)).dtype is dtype


def test_only_fp16_gets_a_gradient_scaler():
    """Only fp16 gets a gradient scaler, and it is enabled on CPU."""
    assert Precision("fp32", "cpu").make_scaler() is None
    assert Precision("bf16", "cpu").make_scaler() is None
    scaler = Precision("fp16", "cpu").make_scaler()
    assert scaler.is_enabled() and scaler.get_scale() == 65536.0


def test_describe_is_the_startup_line():
    assert Precision("fp32", "cpu").describe() == "precision fp32 | autocast off | grad scaler off"
    assert Precision("fp16", "cpu").describe() == "precision fp16 | autocast float16 | grad scaler on"


def test_fp8_converts_only_16_divisible_linears():
    """fp8 converts only Linear layers with dimensions divisible by 16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
    weight = model[0].weight
    precision = Precision("fp8", "cpu")
    precision.convert(model)
    assert precision.fp8_modules == 2
    assert [type(layer).__name__ for layer in model] == ["Float8Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
    assert model[0].weight is weight  # the same parameters: an optimizer built before still holds them
    assert "fp8 modules converted 2" in precision.describe()
    # Converting twice is a no-op, and the converted model trains (emulated on CPU).
    precision.convert(model)
    assert precision.fp8_modules == 2
    assert [type(layer).__name__ for layer in model] == ["Float8Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
    # A second model prepared by the same Accelerator is converted too, and counted.
    precision.convert(nn.Sequential(nn.Linear(16, 16)))
    assert precision.fp8_modules == 3
    with precision.autocast():
        model(torch.randn(16, 32)).float().sum().backward()
    assert model[0].weight.grad is not None and torch.isfinite(model[0].weight.grad).all()


def test_fp8_eligibility():
    assert fp8_eligible(nn.Linear(16, 32), "a")
    assert not fp8_eligible(nn.Linear(16, 10), "a")
    assert not fp8_eligible(nn.Conv1d(16, 16, 1), "a")


def test_fp32_bf16_and_fp16_leave_the_model_alone():
    model = nn.Linear(32, 32)
    for kind in ("fp32", "bf16", "fp16"):
        assert type(Precision(kind, "cpu").convert(model)) is nn.Linear


def test_fp8_on_cpu_without_emulation_names_the_flag():
    """fp8 without CUDA and without emulation is a problem naming the flag."""
    (problem,) = precision_problems(PrecisionKind.fp8, fp8_emulation=False, device_type="cpu")
    assert problem.key == "precision.fp8_emulation"
    assert "compute capability >= 8.9" in problem.message and "precision.fp8_emulation=true" in problem.message
    assert precision_problems(PrecisionKind.fp8, fp8_emulation=True, device_type="cpu") == []


@pytest.mark.parametrize("capability, ok", [((8, 0), False), ((8, 9), True), ((9, 0), True)])
def test_fp8_on_cuda_needs_compute_capability_8_9(monkeypatch, capability, ok):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")
    problems = precision_problems(PrecisionKind.fp8, fp8_emulation=False, device_type="cuda")
    if ok:
        assert problems == []
    else:
        (problem,) = problems
        assert "Stand-in GPU has 8.0" in problem.message


def test_fp8_without_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import now raises ImportError
    problems = precision_problems(PrecisionKind.fp8, fp8_emulation=True, device_type="cpu")
    assert [problem.key for problem in problems] == ["precision"]
    assert "pip install 'torchao>=0.10' (the 'fp8' extra of runner-ml)" in problems[0].message


def test_fp16_on_tpu_is_a_problem():
    (problem,) = precision_problems(PrecisionKind.fp16, fp8_emulation=False, device_type="xla")
    assert "use precision=bf16" in problem.message


def test_cpu_without_fp16_autocast_is_a_problem(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_autocast_runs", lambda dtype: dtype is not torch.float16)
    (problem,) = precision_problems(PrecisionKind.fp16, fp8_emulation=False, device_type="cpu")
    assert "fp16 autocast does not run on this CPU" in problem.message
    assert precision_problems(PrecisionKind.bf16, fp8_emulation=False, device_type="cpu") == []


def test_bf16_warns_only_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)
    assert "runs slower than fp32" in Precision("bf16", "cpu").speed_warning()
    assert Precision("fp32", "cpu").speed_warning() is None
    assert Precision("bf16", "cuda").speed_warning() is None
    assert "emulated" in Precision("fp8", "cpu").speed_warning()
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: True)
    assert Precision("bf16", "cpu").speed_warning() is None


def test_fp8_on_cpu_prints_only_its_refusal(tmp_path):
    """The refusal comes before torchao is imported: importing it prints its own lines (kernels it cannot load here,
    no Triton) that would stand before the one line the user needs."""
    from conftest import run_cli

    result = run_cli("precision=fp8", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "runner: error: bad config: precision.fp8_emulation: precision=fp8 needs a CUDA GPU of compute capability "
        ">= 8.9 (Ada, Hopper or newer) and this run runs on cpu; use precision=bf16, or set "
        "precision.fp8_emulation=true to run the fp8 code path slowly, only to test it"], result.stderr
    assert result.stdout == ""
