"""FLOPs counted per sample, the device's peak, and the train/flops_per_s and train/mfu the loop logs."""

import json
import re

import pytest
import torch
import yaml

from runner.distributed.peak import Peak, cpu_peak, device_peak, gpu_peak, measure_matmul_flops
from runner.models.gpt import GPT
from runner.training.tasks import LanguageModeling, Task
from runner.training.throughput import Throughput, count_flops_per_sample
from tests.conftest import ROOT, TINY, read_jsonl

VOCAB = 80  # the Shakespeare corpus's characters (docs/benchmarks.md)


def gpt_recipe_model() -> tuple[GPT, int, dict]:
    """The gpt recipe's model (recipes/gpt.yaml's sizes; its batch and context)."""
    recipe = yaml.safe_load((ROOT / "recipes" / "gpt.yaml").read_text())
    sizes = {key: recipe["model"][key] for key in ("n_layer", "n_head", "n_embd", "dropout")}
    block = recipe["data"]["block_size"]
    torch.manual_seed(0)
    return GPT(VOCAB, block, **sizes), recipe["trainer"]["batch_size"], sizes


def test_gpt_step_flops_match_the_analytic_count():
    """The counted FLOPs of the gpt recipe's training step are within 5% of 6N + 12 L H Q T per token."""
    model, batch_size, sizes = gpt_recipe_model()
    block = model.block_size
    batch = {"input_ids": torch.randint(0, VOCAB, (batch_size, block)),
             "labels": torch.randint(0, VOCAB, (batch_size, block))}
    counted, how = count_flops_per_sample(model, LanguageModeling(tokens_per_sample=block), batch)
    # PaLM's count (Chowdhery et al. 2022, appendix B), as nanoGPT's estimate_mfu: 6 FLOPs per parameter per token
    # (forward 2, backward 4) over the parameters that multiply (the position table is looked up, not multiplied;
    # the token table is, as the tied head), plus attention's two T x T products per layer, forward and backward.
    parameters = sum(p.numel() for p in model.parameters()) - model.position_embedding.weight.numel()
    layers, width = sizes["n_layer"], sizes["n_embd"]
    analytic_per_token = 6 * parameters + 12 * layers * width * block
    assert counted is not None, how
    ratio = counted / (analytic_per_token * block)
    assert abs(ratio - 1) < 0.05, (counted, analytic_per_token * block, ratio)
    assert "torch.utils.flop_counter" in how


def test_counting_touches_no_weight_gradient_or_rng():
    model, _, _ = gpt_recipe_model()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    batch = {"input_ids": torch.randint(0, VOCAB, (2, 8)), "labels": torch.randint(0, VOCAB, (2, 8))}
    rng = torch.get_rng_state()
    counted, _ = count_flops_per_sample(model, LanguageModeling(), batch)
    assert counted and counted > 0
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert all(parameter.grad is None for parameter in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


class ReadsItsInput(torch.nn.Module):
    """A model whose forward reads a value from its input: impossible on the meta device."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x) * float(x.sum().item() > 0)


def test_a_model_that_fails_on_meta_is_not_counted():
    batch = {"x": torch.randn(2, 4), "y": torch.tensor([0, 1])}
    counted, how = count_flops_per_sample(ReadsItsInput(), Task("x", "y"), batch)
    assert counted is None
    assert how.startswith("not counted: the model's step failed on the meta device (")
    throughput = Throughput(counted, Peak(1e12, "a test"), how)
    assert throughput.metrics(100.0, 1) == {}
    assert throughput.describe() == f"throughput: FLOP/s and MFU not logged: FLOPs {how}"


@pytest.mark.parametrize(("name", "precision", "tf32", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989.4),
    ("NVIDIA H100 PCIe", "bf16", False, 756.0),
    ("NVIDIA H200", "fp8", False, 1978.9),
    ("NVIDIA A100-SXM4-80GB", "fp32", True, 156.0),
    ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5),
])
def test_gpu_peak_from_the_datasheet_table(name, precision, tf32, tflops):
    peak = gpu_peak(name, precision, tf32)
    assert peak.flops_per_s == pytest.approx(tflops * 1e12)
    assert name in peak.source


def test_gpu_peak_unknown_says_why():
    assert gpu_peak("NVIDIA GeForce GT 710", "fp32").flops_per_s is None
    assert "not in runner/distributed/peak.py's table" in gpu_peak("NVIDIA GeForce GT 710", "fp32").source
    v100 = gpu_peak("Tesla V100-SXM2-16GB", "bf16")
    assert v100.flops_per_s is None and "no bf16 tensor-core figure" in v100.source
    assert device_peak(torch.device("meta"), "fp32").flops_per_s is None


def test_cpu_peak_is_measured_once_and_cached(tmp_path):
    first = cpu_peak("fp32", 1, tmp_path)
    assert first.flops_per_s > 1e8 and "measured now" in first.source  # any CPU of this century: > 0.1 GFLOP/s
    cached = json.loads((tmp_path / "peak_flops.json").read_text())
    (key,) = cached
    assert key.endswith("| 1 thread(s) | float32") and cached[key]["flops_per_s"] == first.flops_per_s
    size = cached[key]["size"]
    assert f"a {size}x{size} float32 matmul on 1 thread(s), measured now" in first.source
    again = cpu_peak("fp32", 1, tmp_path)
    assert again.flops_per_s == first.flops_per_s and "cached in" in again.source
    # An older runner's entry (a bare number, measured on 1024x1024) is still read.
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: 5e10}))
    older = cpu_peak("fp32", 1, tmp_path)
    assert older.flops_per_s == 5e10 and "a 1024x1024 float32 matmul on 1 thread(s), measured earlier" in older.source
    # A damaged cache is measured again, not trusted.
    (tmp_path / "peak_flops.json").write_text("{not json")
    assert "measured now" in cpu_peak("fp32", 1, tmp_path).source


def test_an_mfu_above_1_says_the_peak_is_too_low(caplog, monkeypatch, tmp_path):
    """A CPU peak measured while other work held the cores is cached too low, and every train/mfu of the run reads
    above 1; the run says so once."""
    import logging

    monkeypatch.setenv("RUNNER_CACHE_HOME", str(tmp_path))
    throughput = Throughput(1e9, Peak(1e9, "a 256x256 float16 matmul on 2 thread(s), measured now"), "counted")
    with caplog.at_level(logging.WARNING):
        assert throughput.metrics(samples_per_s=0.5, processes=1)["train/mfu"] == 0.5
        assert caplog.text == ""
        assert throughput.metrics(samples_per_s=2.0, processes=1)["train/mfu"] == 2.0
        throughput.metrics(samples_per_s=3.0, processes=1)
    assert caplog.text.count("train/mfu is 2.00, above 1: the peak it is measured against (a 256x256 float16 matmul "
                             "on 2 thread(s), measured now) is too low; on a CPU, delete "
                             f"{tmp_path / 'peak_flops.json'} to measure it again on idle cores") == 1


def test_a_slow_dtype_is_timed_on_a_smaller_square(monkeypatch):
    """One timed product is kept under the budget as the last smaller square predicts it (fp16 on an AVX2 CPU would
    take 2 s a product at 1024x1024): no budget leaves the first square; a generous one goes up to 1024. Which
    square is fastest on this machine is noise (a shared core), so the rest times made-up products."""
    flops, size = measure_matmul_flops(torch.float32, budget_s=0.0)
    assert size == 128 and flops > 1e8

    from runner.distributed import peak

    def timed(rates):  # seconds of one product at each side, from GFLOP/s measured on real CPUs
        return lambda dtype, side, repeats: 2 * side**3 / (rates[side] * 1e9)

    # float32 on one AVX2 core: the BLAS kernels reach their peak on the largest square.
    monkeypatch.setattr(peak, "_matmul_seconds", timed({128: 40.0, 256: 70.0, 512: 85.0, 1024: 90.0}))
    assert measure_matmul_flops(torch.float32, budget_s=3600.0) == (pytest.approx(90e9), 1024)

    # fp16 on 2 threads of an AVX512 CPU: slow on small squares, fast on large ones. Predicted from 128x128, it
    # was timed on 256x256 and its peak put at 2.7 GFLOP/s, under what runs achieve: train/mfu read above 1.
    monkeypatch.setattr(peak, "_matmul_seconds", timed({128: 0.3, 256: 2.7, 512: 22.5, 1024: 77.6}))
    assert measure_matmul_flops(torch.float16) == (pytest.approx(77.6e9), 1024)
    # fp16 on an AVX2 CPU, about 1 GFLOP/s at every size: a 512x512 product would take 0.27 s.
    monkeypatch.setattr(peak, "_matmul_seconds", timed({128: 1.0, 256: 1.0, 512: 1.0, 1024: 1.0}))
    assert measure_matmul_flops(torch.float16) == (pytest.approx(1e9), 256)


def test_the_loop_logs_flops_per_second_and_mfu(cli, tmp_path):
    """train/flops_per_s = samples/s x counted FLOPs per sample / processes; train/mfu = that / the cached peak."""
    cache = tmp_path / "cache"
    result = cli(*TINY, "trainer.log_every_steps=2", "trainer.max_steps=6", env={"RUNNER_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.output
    line = next(text for text in result.output.splitlines() if "throughput: " in text)
    assert "per sample (counted on one step's forward and backward by torch.utils.flop_counter)" in line
    assert "measured now" in line
    (cached,) = json.loads((cache / "peak_flops.json").read_text()).values()
    peak = cached["flops_per_s"]
    # The default recipe's model, counted here the same way, gives the per-sample figure the loop divides by.
    rows = [row for row in read_jsonl(result.run_dir() / "metrics.jsonl") if "train/loss" in row]
    assert len(rows) == 3
    per_sample = {row["train/flops_per_s"] / row["train/samples_per_s"] for row in rows}
    assert max(per_sample) / min(per_sample) - 1 < 1e-9  # one count, used for every log
    shown = float(re.search(r"throughput: ([\d.]+) MFLOP per sample", line).group(1)) * 1e6  # 3 significant digits
    assert abs(min(per_sample) / shown - 1) < 0.005, (per_sample, line)
    for row in rows:
        assert row["train/mfu"] == pytest.approx(row["train/flops_per_s"] / peak, rel=1e-12)
        assert 0 < row["train/mfu"] < 1
