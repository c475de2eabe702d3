"""runner.accelerate.memory and `runner plan`: the figures from the meta device against the tensors a real model, its
gradients and its optimizer hold (FSDP's shards on 2 processes: tests/accelerate/test_parallel.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from runner.run.compose import load
from runner.commands.cli import main as cli_main
from runner.config import ParallelConfig, ParallelKind, PrecisionKind
from runner.accelerate.memory import human, memory_plan
from runner.models import GPT
from runner.commands.plan import describe_run, main


def tiny_gpt() -> GPT:
    return GPT(vocab_size=17, block_size=8, n_layer=3, n_head=2, n_embd=32, dropout=0.0)


def plan_of(optimizer_class, parallel=ParallelConfig(), world_size: int = 1, precision=PrecisionKind.fp32, **options):
    with torch.device("meta"):
        model = tiny_gpt()
    return memory_plan(model, optimizer_class(model.parameters(), **options), parallel, world_size, precision)


def real_bytes(optimizer_class, **options) -> dict:
    model = tiny_gpt()
    optimizer = optimizer_class(model.parameters(), **options)
    model(torch.randint(0, 17, (2, 8))).float().square().mean().backward()
    optimizer.step()
    size = lambda tensors: sum(tensor.numel() * tensor.element_size() for tensor in tensors)  # noqa: E731
    return {"weights": size(model.parameters()), "gradients": size(p.grad for p in model.parameters()),
            "optimizer": size(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)),
            "parameters": sum(p.numel() for p in model.parameters())}


@pytest.mark.parametrize("optimizer_class, options", [
    (torch.optim.AdamW, {"lr": 1e-3}),  # exp_avg, exp_avg_sq and a step scalar per parameter
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),  # a momentum buffer
    (torch.optim.SGD, {"lr": 0.1}),  # no state at all
])
def test_one_process_figures_match_real_tensors(optimizer_class, options):
    """On one process the figures are the bytes the real tensors hold."""
    plan, real = plan_of(optimizer_class, **options), real_bytes(optimizer_class, **options)
    every_name = sum(p.numel() for _, p in tiny_gpt().named_parameters(remove_duplicate=False))
    assert plan.parameters == real["parameters"] == every_name - 17 * 32  # the tied head and embedding once
    assert (plan.weight_bytes, plan.gradient_bytes, plan.optimizer_bytes) == (
        real["weights"], real["gradients"], real["optimizer"])
    assert plan.bucket_bytes == plan.gathered_bytes == 0


def test_ddp_adds_buckets_and_fsdp_holds_a_share():
    """DDP adds its gradient buckets; FSDP holds a share plus what it gathers."""
    one = plan_of(torch.optim.AdamW, lr=1e-3)
    ddp = plan_of(torch.optim.AdamW, ParallelConfig(), 2, lr=1e-3)
    assert ddp.total_bytes == one.total_bytes + one.gradient_bytes  # the buckets: a copy of the gradients
    viewed = plan_of(torch.optim.AdamW, ParallelConfig(gradient_as_bucket_view=True), 2, lr=1e-3)
    assert viewed.total_bytes == one.total_bytes
    fsdp = ParallelConfig(kind=ParallelKind.fsdp)
    four = plan_of(torch.optim.AdamW, fsdp, 4, lr=1e-3)
    # Every first dimension here but the embedding's 17 rows splits evenly in 4: it takes 5 rows per process.
    assert four.weight_bytes == (one.weight_bytes + (5 * 4 - 17) * 32 * 4) // 4
    blocks = 3 * sum(p.numel() for p in tiny_gpt().blocks[0].parameters())
    own, block = one.parameters - blocks, blocks // 3
    assert four.gathered_bytes == (own + 2 * block) * 4
    assert plan_of(torch.optim.AdamW, fsdp, 4, PrecisionKind.bf16, lr=1e-3).gathered_bytes == (own + 2 * block) * 2


def test_runner_plan_builds_one_batch_of_data(capsys, monkeypatch):
    """runner plan prints the figures, generating one batch of rows (for the step's FLOPs), never the whole data."""
    spec = load(["hardware=multi_cpu", "hardware.num_processes=2", "parallel=fsdp", "precision=bf16",
                 "trainer.batch_size=32", "trainer.micro_batch_size=8", "trainer.max_steps=50",
                 "data.num_train=999999999"])  # a dataset that would take minutes to generate: never built whole
    from runner.config import instantiate

    built = []

    def one_batch_at_most(node):
        built.append((node["num_train"], node["num_validation"]))
        return real_build_data(node)

    real_build_data = instantiate.build_data
    monkeypatch.setattr("runner.config.instantiate.build_data", one_batch_at_most)  # a fact, not a stopwatch
    text = describe_run(spec)
    assert built == [(8, 8)]  # the per-device batch
    lines = text.splitlines()
    assert lines[0] == "plan: parallel fsdp on 2 cpu process(es), precision bf16"
    assert lines[1] == "model: 69,130 parameters (SeqTransformer)"  # conf/model/seq_transformer.yaml
    # 69,130 fp32 parameters, every first dimension even: half each, AdamW twice that (+ 4-byte step scalars).
    assert lines[2].startswith("per process: weights 135.0 KiB, gradients 135.0 KiB, optimizer state 270.2 KiB, "
                               "gathered while computing 135.0 KiB = 675.2 KiB")
    assert lines[3] == "batch: 32 global per optimizer step = 8 per device x 2 process(es) x 2 accumulation step(s)"
    assert lines[4] == "steps: at most 50 optimizer steps (trainer.max_steps) within 3 epoch(s)"
    by_epochs = describe_run(load(["trainer.max_steps=null", "trainer.max_epochs=2"])).splitlines()[4]
    assert by_epochs == ("steps: 2 epoch(s), each of (training rows / 64, the global batch) optimizer steps "
                         "(`runner recipes validate NAME` counts them)")
    assert lines[5].startswith("fits: yes, 675.2 KiB of ") and lines[5].endswith(" per process, before activations")
    # A step's FLOPs per process (16 of the global batch of 32) and the least time they take at the peak measured
    # with the threads each of the 2 processes will have.
    flops = r"([\d.]+ [MGT]?FLOP)"
    step = re.fullmatch(rf"step time: {flops} per process per optimizer step \({flops} per sample, counted on one "
                        rf"step's forward and backward by torch.utils.flop_counter\) -> at least ([\d.]+) ms at "
                        rf"the device's peak of {flops}/s \(a (\d+)x\5 bfloat16 matmul on \d+ thread\(s\), "
                        r"measured (now|earlier, cached in \S+)\); the run logs train/mfu, the share of that peak it reaches", lines[6])
    assert step, lines[6]
    per_step, per_sample, peak = (flop_count(step.group(index)) for index in (1, 2, 4))
    assert per_step == pytest.approx(16 * per_sample, rel=0.01)  # both printed to 3 significant digits
    assert float(step.group(3)) == pytest.approx(per_step / peak * 1e3, rel=0.02)
    # Weights and optimizer state (the checkpoint), and the time writing them takes at the speed measured here.
    saved = re.fullmatch(r"checkpoint: 405.2 KiB per process \(weights and optimizer state\); ([\d.]+ [KMG]?i?B)/s "
                         r"measured writing to (\S+) -> about ([\d.]+) s per save \(SIGTERM's grace period must "
                         r"cover one optimizer step and this\)", lines[7])
    assert saved and Path(saved.group(2)).is_dir() and float(saved.group(3)) >= 0, lines[7]
    assert not list(Path(saved.group(2)).glob(".runner-write-probe-*"))  # the probe file is gone

    cli_main(["plan", "parallel=ddp", "hardware=multi_cpu", "hardware.num_processes=2",  # `runner plan ...`
              "model.d_model=8192", "model.dim_feedforward=65536", "model.num_layers=8"])
    printed = capsys.readouterr().out
    assert "DDP gradient buckets" in printed
    assert "fits: no: " in printed and "use parallel=fsdp, more processes, or a smaller model" in printed
    with pytest.raises(SystemExit) as refused:
        main(["parallel=fsdp", "precision=fp16", "hardware=multi_cpu"])
    assert refused.value.code == 1
    assert "runner: error: bad config: precision: is fp16, which parallel=fsdp does not support" in capsys.readouterr().err


def flop_count(text: str) -> float:
    """'79.8 MFLOP' -> 79.8e6 (runner.training.throughput.human_flops, read back)."""
    number, unit = text.split()
    return float(number) * {"FLOP": 1, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}[unit]


def test_human_sizes():
    assert [human(size) for size in (512, 2048, 3 * 2**20, 5 * 2**40)] == ["512 B", "2.0 KiB", "3.0 MiB",
                                                                          "5120.0 GiB"]


def test_runner_plan_reads_a_tables_schema(tmp_path, monkeypatch):
    """runner plan reads a table's schema for the sizes the data fills."""
    (tmp_path / "t.csv").write_text("a,b,c,label\n" + "".join(f"{i},{i % 4},{i % 5},{['x', 'y'][i % 2]}\n"
                                                           for i in range(20)))
    monkeypatch.chdir(tmp_path)
    text = describe_run(load(["recipe=tabular_csv", "data.train=t.csv"]))
    # MLP 3 -> 64 -> 2 behind a Standardize layer: 3*64+64 + 64*2+2 = 386 parameters.
    assert text.splitlines()[1] == "model: 386 parameters (MLP)"
