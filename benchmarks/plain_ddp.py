"""The plain-PyTorch baseline for benchmarks/distributed.py: the runner's default workload (reverse 12 digits with a
small Transformer encoder, AdamW) as a hand-written DDP script, started by torchrun.

    torchrun --standalone --nproc_per_node 2 benchmarks/plain_ddp.py --out DIR --steps 60 --log-every 10
    torchrun --standalone --nproc_per_node 2 benchmarks/plain_ddp.py --framework fabric --out DIR

`--framework accelerate|fabric` runs the same loop on HuggingFace Accelerate or Lightning Fabric instead of wrapping
the model in DDP by hand (benchmarks/alternatives.py): what a user would pick instead of the runner.
Writes DIR/first_step when the first optimizer step is done (the benchmark polls for it) and DIR/result.json with
steps/s per logging window, measured like the runner's train/samples_per_s (the loss is read once per window).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class SeqTransformer(nn.Module):
    """The same architecture as runner.models.SeqTransformer (copied, so this script imports only torch)."""

    def __init__(self, vocab_size=10, max_len=12, d_model=64, nhead=4, num_layers=2, dim_feedforward=128):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, 0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(hidden)))


def warmup_cosine(total_steps: int, warmup_steps: int):
    """The reverse recipe's schedule (runner.training.schedules.warmup_cosine, min_lr_ratio 0)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--framework", choices=("accelerate", "fabric"), help="set the loop up on this instead")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    framework = None
    if args.framework:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from alternatives import framework as set_up

        # Each joins the process group torchrun's environment describes, as it would in a user's script.
        framework = set_up(args.framework, processes=int(os.environ.get("WORLD_SIZE", "1")))
    elif distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    source = torch.randint(0, 10, (args.rows, 12), generator=torch.Generator().manual_seed(1234))
    target = source.flip(1)
    model = SeqTransformer()
    if distributed and framework is None:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.steps, warmup_steps=100))
    if framework is not None:
        model, optimizer = framework.setup(model, optimizer)
    backward = framework.backward if framework is not None else (lambda loss: loss.backward())

    # The benchmark reads this worker's CPU time; renamed into place, so its poll never reads a half-written file.
    (args.out / f".pid_{rank}").write_text(str(os.getpid()))
    (args.out / f".pid_{rank}").replace(args.out / f"pid_{rank}")
    order = torch.randperm(args.rows, generator=torch.Generator().manual_seed(0))[rank::world]
    windows, running, start = [], torch.zeros(()), time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = order[((step - 1) * args.batch_size) % len(order):][: args.batch_size]
        loss = F.cross_entropy(model(source[rows]).reshape(-1, 10).float(), target[rows].reshape(-1))
        backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        running += loss.detach()
        if step == 1 and rank == 0:
            (args.out / "first_step").write_text(str(time.time()))
        if step % args.log_every == 0:
            if distributed:
                dist.all_reduce(running)
            running.item()
            windows.append(args.log_every / (time.perf_counter() - start))
            if rank == 0:
                with open(args.out / "progress", "a") as progress:
                    progress.write(f"{step}\n")
            running.zero_()
            start = time.perf_counter()
    # Every arm must train one model, not one per process: the replicas end equal only if gradients were averaged.
    weights = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    highest, lowest = weights.clone(), weights.clone()
    if distributed:
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    if rank == 0:
        result = {"steps_per_s": windows, "replicas_equal": torch.equal(highest, lowest)}
        (args.out / "result.json").write_text(json.dumps(result))
    if distributed:
        # DDP's reducer (kept by the frameworks too) holds the group's threads: ending the group under it hangs or
        # aborts at exit ("terminate called without an active exception"), so drop every holder first.
        del model, optimizer, scheduler, framework
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
