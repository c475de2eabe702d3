"""GPU-only checks (`pytest -m gpu`): skipped without CUDA. The CPU suite covers the same paths with stand-ins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runner.accelerate.accelerator import Accelerator

from conftest import TINY

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _train(precision: str, steps: int = 5) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    accelerator = Accelerator("cuda", precision)
    model = accelerator.convert_precision(model)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        features = torch.randn(32, 64, generator=generator).cuda()
        labels = torch.randint(0, 16, (32,), generator=generator).cuda()
        with accelerator.autocast():
            loss = F.cross_entropy(model(features).float(), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return model.cpu()


def test_prepare_places_model_and_batches_on_the_gpu():
    accelerator = Accelerator("cuda")
    loader = torch.utils.data.DataLoader([{"x": torch.ones(4)}, {"x": torch.ones(4)}], batch_size=2)
    model, batches = accelerator.prepare(nn.Linear(4, 4), loader)
    assert next(model.parameters()).is_cuda
    assert next(iter(batches))["x"].is_cuda


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_gpu_tracks_fp32(precision):
    reference, candidate = _train("fp32"), _train(precision)
    moved = max((p - q).abs().max().item() for p, q in zip(reference.parameters(), _untrained().parameters()))
    difference = max((p - q).abs().max().item() for p, q in zip(reference.parameters(), candidate.parameters()))
    assert 0 < difference < 0.1 * moved


def _untrained() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))


def test_fp16_scaler_is_enabled_on_cuda():
    assert Accelerator("cuda", "fp16").scaler.is_enabled()


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9), reason="needs sm_89+")
def test_fp8_converts_and_trains_on_a_capable_gpu():
    model = _train("fp8")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_gpu_ids_applies_before_cuda_initialises():
    """The parent exports CUDA_VISIBLE_DEVICES and then runs the checks that touch CUDA: it must still see one GPU."""
    last = torch.cuda.device_count() - 1
    code = (
        "import torch\n"
        "from runner.config import HardwareConfig, HardwareKind\n"
        "from runner.distributed.devices import resolve_hardware\n"
        f"hardware = resolve_hardware(HardwareConfig(kind=HardwareKind.gpu), [{last}])\n"
        "hardware.apply()\n"
        "assert hardware.problems == (), hardware.problems\n"
        "print(torch.cuda.device_count())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "1"


def test_the_cli_on_one_gpu_with_gpu_ids(cli):
    last = torch.cuda.device_count() - 1
    result = cli(*TINY, "hardware=gpu", f"gpu_ids=[{last}]", "precision=bf16", "trainer.max_steps=3")
    assert result.returncode == 0, result.output
    assert f"physical {last} -> rank 0 -> cuda:0" in result.output
    assert "device cuda:0 | precision bf16 | autocast bfloat16" in (result.run_dir() / "runner.log").read_text()


def test_sigkill_resume_auto_is_bitwise_exact_on_gpu(tmp_path_factory):
    """tests/training/test_resume.py's SIGKILL case with hardware=gpu: killed after its checkpoint at step 6, resume=auto must
    end with the uninterrupted run's weights, bit for bit, and log the same values (the MLP's CUDA kernels are
    deterministic for a fixed shape, so any difference is the resume's)."""
    from resume_helpers import RUN, assert_same_run, kill_everything, run_cli, start, wait_for_checkpoint

    reference_cwd, cwd = tmp_path_factory.mktemp("reference"), tmp_path_factory.mktemp("killed")
    result = run_cli(*RUN, "hardware=gpu", "hydra.run.dir=run", cwd=reference_cwd)
    assert result.returncode == 0, result.output
    run_dir = cwd / "run"
    proc = start(cwd, run_dir, 6, "hardware=gpu")
    wait_for_checkpoint(cwd, run_dir, proc, 6)
    kill_everything(proc)
    resumed = run_cli(*RUN, "hardware=gpu", f"hydra.run.dir={run_dir}", "resume=auto", cwd=cwd)
    assert resumed.returncode == 0, resumed.output
    assert "resum" in resumed.output.lower()
    assert_same_run(run_dir, reference_cwd / "run")
