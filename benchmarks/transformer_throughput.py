"""The runner's training loop against a raw bf16 loop on the same GPT, on one GPU: steps/s, their ratio, and MFU.

    python benchmarks/transformer_throughput.py                      # GPT-2 small shape, bf16, 2 rounds
    python benchmarks/transformer_throughput.py --rounds 3 --steps 200

Both arms train the same model (runner.models.GPT: 12 layers, 12 heads, 768 wide, 1024 tokens of context, vocabulary
256, no dropout) with AdamW, gradient clipping at 1.0 and bf16 autocast, batch 16:

- runner: `python -m runner recipe=gpt hardware=gpu precision=bf16 callbacks=[throughput]` on a generated text file
  (what a user runs; the ThroughputMonitor callback logs perf/steps_per_s per logging window);
- plain: the loop a careful PyTorch user writes (nanoGPT's): random block offsets into a token tensor, pinned and
  copied without blocking, forward under torch.autocast(bfloat16), backward, clip, step, zero_grad.

Each arm is a fresh process; the arms alternate (A B, B A, ...) so drift hits both. Each figure is the median of the
logging windows after the first (the first holds CUDA's and cuBLAS's warm-up). MFU counts nanoGPT's FLOPs per token,
6N + 12 L H Q T (N: parameters without the position embedding), against the device's dense bf16 peak from the
table below (a GPU not in it gets its achieved TFLOP/s only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 256}
BATCH = 16
WINDOW = 25  # steps per logging window

# Dense bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets (SXM parts).
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}


def peak_tflops(device_name: str) -> float | None:
    for name, peak in BF16_PEAK_TFLOPS.items():
        if name in device_name:
            return peak
    return None


def flops_per_token(parameters: int) -> float:
    """nanoGPT's estimate (model.estimate_mfu): 6 per parameter and token, plus attention's 12 L H Q T."""
    head_dim = MODEL["n_embd"] // MODEL["n_head"]
    return 6 * parameters + 12 * MODEL["n_layer"] * MODEL["n_head"] * head_dim * MODEL["block_size"]


def write_corpus(path: Path, megabytes: int = 4) -> None:
    """Printable text of a few thousand words, made up here: no download."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    lines, size = [], 0
    while size < megabytes * 2**20:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")


def runner_arm(corpus: Path, steps: int, work: Path) -> list[float]:
    """steps/s of each logging window, read back from the run's metrics.jsonl."""
    run_dir = work / f"run-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "runner", "recipe=gpt", f"data.train={corpus}", "hardware=gpu", "precision=bf16",
               f"model.n_layer={MODEL['n_layer']}", f"model.n_head={MODEL['n_head']}", f"model.n_embd={MODEL['n_embd']}",
               f"model.vocab_size={MODEL['vocab_size']}",  # the plain arm's size (null would take the corpus's)
               f"data.block_size={MODEL['block_size']}", f"trainer.batch_size={BATCH}", f"trainer.max_steps={steps}",
               f"trainer.log_every_steps={WINDOW}", f"trainer.eval_every_steps={10 * steps}",
               "trainer.eval_batch_size=16", "trainer.progress_bar=false", "checkpoint.enabled=false",
               "callbacks=[throughput]", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the runner arm failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["perf/steps_per_s"] for row in rows if "perf/steps_per_s" in row]


def plain_arm(steps: int, device_name: str = "cuda") -> list[float]:
    import torch
    import torch.nn.functional as F

    from runner.models import GPT

    device = torch.device(device_name)
    torch.manual_seed(0)
    model = GPT(**MODEL, dropout=0.0, bias=False, tie_weights=True).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    tokens = torch.randint(0, MODEL["vocab_size"], (4 * 2**20,), dtype=torch.int64)
    block = MODEL["block_size"]

    def to_device(rows):
        return rows.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else rows

    def get_batch():
        ix = torch.randint(len(tokens) - block - 1, (BATCH,))
        x = to_device(torch.stack([tokens[i : i + block] for i in ix]))
        y = to_device(torch.stack([tokens[i + 1 : i + 1 + block] for i in ix]))
        return x, y

    windows, started = [], time.perf_counter()
    for step in range(1, steps + 1):
        x, y = get_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % WINDOW == 0:
            loss.item()  # the runner's window also ends when the logged loss is read
            now = time.perf_counter()
            windows.append(WINDOW / (now - started))
            started = now
    return windows


def parameters_without_position_embedding() -> int:
    from runner.models import GPT

    model = GPT(**MODEL, dropout=0.0, bias=False, tie_weights=True)
    names = {id(p): n for n, p in model.named_parameters()}
    return sum(p.numel() for p in model.parameters() if "wpe" not in names[id(p)] and "pos" not in names[id(p)])


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6 * WINDOW, help="steps per run, a multiple of 25")
    parser.add_argument("--arm", choices=("plain",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm == "plain":
        print(json.dumps(plain_arm(args.steps)))
        return

    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks/transformer_throughput.py needs a CUDA GPU (torch sees none)")
    device_name = torch.cuda.get_device_name(0)
    results: dict[str, list[float]] = {"runner": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        write_corpus(corpus)
        for round_ in range(args.rounds):
            for arm in (("runner", "plain") if round_ % 2 == 0 else ("plain", "runner")):
                if arm == "runner":
                    windows = runner_arm(corpus, args.steps, work)
                else:
                    proc = subprocess.run([sys.executable, __file__, "--arm", "plain", "--steps", str(args.steps)],
                                          capture_output=True, text=True, env={**os.environ})
                    if proc.returncode != 0:
                        raise RuntimeError(f"the plain arm failed:\n{proc.stderr[-3000:]}")
                    windows = json.loads(proc.stdout.strip().splitlines()[-1])
                results[arm].append(statistics.median(windows[1:]))
                print(f"round {round_ + 1} {arm}: {results[arm][-1]:.2f} steps/s (windows: "
                      + ", ".join(f"{w:.2f}" for w in windows) + ")", flush=True)

    runner_sps, plain_sps = statistics.median(results["runner"]), statistics.median(results["plain"])
    tokens_per_step = BATCH * MODEL["block_size"]
    achieved = flops_per_token(parameters_without_position_embedding()) * tokens_per_step * runner_sps / 1e12
    peak = peak_tflops(device_name)
    print(f"{device_name}, GPT {MODEL['n_layer']}x{MODEL['n_embd']}, block {MODEL['block_size']}, batch {BATCH}, bf16, "
          f"{args.rounds} round(s) of {args.steps} steps")
    print(f"steps/s: runner {runner_sps:.2f}, plain {plain_sps:.2f}; ratio runner/plain {runner_sps / plain_sps:.3f} "
          f"(target >= 0.98)")
    print(f"tokens/s: runner {runner_sps * tokens_per_step:,.0f}; achieved {achieved:.1f} TFLOP/s"
          + (f", MFU {achieved / peak:.1%} of {peak} TFLOP/s dense bf16" if peak else " (peak unknown for this GPU)"))


if __name__ == "__main__":
    main()
