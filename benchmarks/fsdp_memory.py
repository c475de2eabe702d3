"""Peak memory per process and steps/s of parallel=fsdp against parallel=ddp on 2 gloo processes.

    python benchmarks/fsdp_memory.py               # 2 rounds, DDP and FSDP alternating (about 2 minutes on 2 cores)
    python benchmarks/fsdp_memory.py --rounds 1 --steps 4

Workload: runner's GPT (4 blocks of width 512, 12.75M parameters, 48.6 MiB in fp32) with AdamW, a global batch of
4 sequences of 64 tokens: the weights, gradients and optimizer state dwarf the activations, which is where
sharding matters. Each arm is a fresh launch of 2 processes (spawn, one torch thread each) that prepares the model
with runner.Accelerator(parallel=...), as the runner does, and trains `--steps` timed optimizer steps after 2
warm-up steps.

Memory: bytes in use in glibc's allocator (mallinfo2, every arena), where torch's CPU tensors live, minus what
was in use before the model was built (torch imported, process group up). "held" is after an optimizer step (the
weights, gradients and optimizer state a process keeps); "peak" the most seen while forward and backward pass
through the blocks (also the units FSDP gathers, and the activations). The resident set is not used: the
allocator keeps freed memory in per-thread arenas (gloo's threads have their own), which it inflates by hundreds
of MiB on both sides (measured). Next to them, what `runner plan` predicts for the same model (runner/accelerate/memory.py;
activations not included). Steps/s: the timed steps of rank 0, wall clock (other people's jobs move it: read the
ratio).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
import uuid

GPT_SHAPE = {"vocab_size": 256, "block_size": 64, "n_layer": 4, "n_head": 8, "n_embd": 512, "dropout": 0.0}
GLOBAL_ROWS, WARMUP = 4, 2


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def heap_bytes() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def worker(kind: str, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from runner import Accelerator
    from runner.distributed.dist import DistInfo, destroy_process_group, init_process_group
    from runner.models import GPT

    torch.set_num_threads(1)
    info = DistInfo.from_env()
    init_process_group(info, "gloo")
    try:
        baseline = heap_bytes()
        torch.manual_seed(0)
        model = GPT(**GPT_SHAPE)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        accelerator = Accelerator("cpu", parallel=kind)
        model, optimizer = accelerator.prepare(model, optimizer)
        peak = [0]

        def sample(*_):
            peak[0] = max(peak[0], heap_bytes() - baseline)

        for block in accelerator.unwrap_model(model).blocks:
            block.register_forward_hook(sample)
            block.register_full_backward_hook(sample)
        generator = torch.Generator().manual_seed(1)
        timings = []
        for step in range(WARMUP + steps):
            tokens = torch.randint(0, 256, (GLOBAL_ROWS, 64), generator=generator)[info.rank::info.world_size]
            started = time.perf_counter()
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # kept allocated, as a run's steady state holds them
            float(loss.detach())
            sample()
            if step >= WARMUP:
                timings.append(time.perf_counter() - started)
        return {"held": heap_bytes() - baseline, "peak": peak[0], "steps_per_s": len(timings) / sum(timings)}
    finally:
        destroy_process_group()


def launch(kind: str, steps: int) -> dict:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"fsdp-memory-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn")
    return elastic_launch(config, worker)(kind, steps)


def predicted(kind: str) -> int:
    import torch

    from runner.config import ParallelConfig, ParallelKind, PrecisionKind
    from runner.accelerate.memory import memory_plan
    from runner.models import GPT

    with torch.device("meta"):
        model = GPT(**GPT_SHAPE)
    plan = memory_plan(model, torch.optim.AdamW(model.parameters(), lr=1e-4), ParallelConfig(kind=ParallelKind(kind)),
                       2, PrecisionKind.fp32)
    return plan.total_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    mib = 2**20
    rows = {"ddp": [], "fsdp": []}
    for round_ in range(args.rounds):
        for kind in ("ddp", "fsdp"):
            results = launch(kind, args.steps)
            rows[kind].append(results)
            figures = ", ".join(f"rank {rank} held {results[rank]['held'] / mib:.0f} / peak "
                                f"{results[rank]['peak'] / mib:.0f} MiB" for rank in sorted(results))
            print(f"round {round_ + 1} {kind}: {figures}; {results[0]['steps_per_s']:.2f} steps/s", flush=True)
    summary = {}
    for kind, runs in rows.items():
        summary[kind] = {
            **{f"{what}_mib": statistics.median(max(r[what] for r in run.values()) for run in runs) / mib
               for what in ("held", "peak")},
            "steps_per_s": statistics.median(run[0]["steps_per_s"] for run in runs),
            "planned_mib": predicted(kind) / mib,
        }
    for what in ("held", "peak"):
        summary[f"{what}_ratio"] = summary["fsdp"][f"{what}_mib"] / summary["ddp"][f"{what}_mib"]
    summary["speed_ratio"] = summary["fsdp"]["steps_per_s"] / summary["ddp"]["steps_per_s"]
    print("| parallel | held per process (MiB) | peak per process (MiB) | runner plan (MiB) | steps/s |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("ddp", "fsdp"):
        row = summary[kind]
        print(f"| {kind} | {row['held_mib']:.0f} | {row['peak_mib']:.0f} | {row['planned_mib']:.0f} | "
              f"{row['steps_per_s']:.2f} |")
    print(f"fsdp / ddp: held {summary['held_ratio']:.2f}, peak {summary['peak_ratio']:.2f}, "
          f"steps/s {summary['speed_ratio']:.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
