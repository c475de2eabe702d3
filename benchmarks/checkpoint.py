"""Checkpoint save/load time of a ~100M-parameter model with its AdamW state, against plain torch.save/torch.load
of the same dicts, measured in the same process, alternating (runner, plain, runner, plain, ...).

    python benchmarks/checkpoint.py [--params 100] [--repeats 3] [--dir /tmp/ckpt-bench]

"runner" save = safetensors weights + torch.save of optimizer/RNG/loop state into a partial directory: the time the
training loop is blocked. "until sealed" adds what a background thread then does while training goes on: every
file hashed (sha256 per 64 MiB block) and fsynced, manifest written last, directory renamed, `latest` moved.
"plain" save = one torch.save({"model":..., "optimizer":...}) (no fsync, no checksum): the usual baseline.
"runner" load = verify sizes + sha256 against the manifest, load_model (safetensors) + torch.load(weights_only=True).
"plain" load = torch.load(weights_only=True) + model.load_state_dict + optimizer.load_state_dict.
Before each load the page cache keeps what the last save wrote (both sides alike: a warm-cache comparison);
before each save, os.sync() flushes what earlier steps left dirty, so neither side pays for the other's writeback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
from torch import nn


from runner.checkpoint import Checkpointer, find_resume, restore
from runner.config import CheckpointConfig, MonitorMode


def model_of(million_params: int) -> nn.Module:
    width = 2048
    layers = max(1, round(million_params * 1e6 / (width * width + width)))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def trained(million_params: int):
    torch.manual_seed(0)
    model = model_of(million_params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, 2048)).sum().backward()
    optimizer.step()  # AdamW state (exp_avg, exp_avg_sq) now exists for every parameter
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def runner_save(root: Path, model, optimizer) -> Checkpointer:
    """What the training loop waits for: the files written; sealing (hash, fsync, rename) goes on in the background."""
    checkpointer = Checkpointer(root, CheckpointConfig(export=False), writer=True, monitor="val/loss",
                                monitor_mode=MonitorMode.min, world_size=1, resolved={"bench": True})
    state = {"optimizer": optimizer.state_dict(), "scheduler": None, "scaler": None, "loop": {"step": 1}}
    checkpointer.save(model, state, {"step": 1, "epoch": 0, "batch_in_epoch": 1}, {})
    return checkpointer


def runner_load(root: Path, model, optimizer, verify: bool = True) -> None:
    path = find_resume("auto", root, verify=verify)
    restore(path, model, optimizer, resolved={"bench": True})


def runner_load_unverified(root: Path, model, optimizer) -> None:
    runner_load(root, model, optimizer, verify=False)


def plain_save(root: Path, model, optimizer) -> None:
    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, root / "plain.pt")


def plain_load(root: Path, model, optimizer) -> None:
    state = torch.load(root / "plain.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=100, help="model size in millions of parameters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/runner-checkpoint-bench"))
    args = parser.parse_args()
    model, optimizer = trained(args.params)
    count = sum(p.numel() for p in model.parameters())
    print(f"model: {count / 1e6:.1f}M parameters, {count * 4 / 2**20:.0f} MiB weights + "
          f"{count * 8 / 2**20:.0f} MiB AdamW state; torch {torch.__version__}, {torch.get_num_threads()} threads")
    keys = ("runner save", "runner save until sealed", "plain save", "runner load", "runner load, verify=false",
            "plain load")
    times = {key: [] for key in keys}
    for _ in range(args.repeats):
        for name, save, load in (("runner", runner_save, runner_load), ("plain", plain_save, plain_load)):
            root = args.dir / name
            shutil.rmtree(root, ignore_errors=True)
            os.sync()  # start each save with no dirty pages: else one side pays for the other's delayed writeback
            start = time.perf_counter()
            checkpointer = save(root, model, optimizer)
            times[f"{name} save"].append(time.perf_counter() - start)
            if checkpointer is not None:
                checkpointer.wait()  # sealed: hashed, fsynced, renamed into place
                times["runner save until sealed"].append(time.perf_counter() - start)
            fresh_model, fresh_optimizer = trained(args.params)
            times[f"{name} load"].append(timed(load, root, fresh_model, fresh_optimizer))
            if name == "runner":
                times["runner load, verify=false"].append(timed(runner_load_unverified, root, fresh_model, fresh_optimizer))
            shutil.rmtree(root, ignore_errors=True)
            del fresh_model, fresh_optimizer
    median = {key: statistics.median(values) for key, values in times.items()}
    for key, values in times.items():
        print(f"{key:26s} median {median[key]:6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"save ratio runner/plain: {median['runner save'] / median['plain save']:.2f}x (target <= 1.1x; the time "
          f"training is blocked); until sealed and durable {median['runner save until sealed'] / median['plain save']:.2f}x")
    print(f"load ratio runner/plain: {median['runner load'] / median['plain load']:.2f}x (target < 1.0x); "
          f"without sha256 verification {median['runner load, verify=false'] / median['plain load']:.2f}x")


if __name__ == "__main__":
    main()
