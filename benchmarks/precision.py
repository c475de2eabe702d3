"""Training steps/s of each precision relative to fp32 on this device, for runner.Accelerator and a plain loop, and
the loss each precision reaches after the same steps (what the speed costs in accuracy).

    python benchmarks/precision.py                 # fp32, bf16, fp16 on this machine's default device
    python benchmarks/precision.py --fp8 --rounds 5

Both loops are measured in the same run, alternating (A B A B ...) so a busy machine slows both alike; each figure
is the median over rounds. On a CPU the default clock is this process's CPU time with one torch thread
(`--clock cpu`): on a machine shared with other jobs, wall-clock figures swing several-fold between rounds, CPU time
does not. On an idle machine the two agree; `--clock wall` measures wall-clock time. The plain loop is what a careful PyTorch user writes by hand (torch.autocast, and a
GradScaler for fp16); the runner loop is the same step through Accelerator.accumulate / autocast / backward / step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from runner.accelerate.accelerator import Accelerator
from runner.accelerate.precision import AUTOCAST_DTYPES, Precision
from runner.config import PrecisionKind


CLOCK = [time.perf_counter]


def make_model(width: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16)).to(device)


def plain_steps(precision: str, batches, width: int, device: torch.device) -> float:
    model = make_model(width, device)
    if precision == "fp8":
        Precision("fp8", device.type).convert(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = AUTOCAST_DTYPES[PrecisionKind(precision)]
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    start = CLOCK[0]()
    for features, labels in batches:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(features).float(), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return len(batches) / (CLOCK[0]() - start)


LAST_LOSS: dict[str, float] = {}
"""The runner loop's loss at its last step, per precision: the same seed, data and steps in every round."""


def runner_steps(precision: str, batches, width: int, device: torch.device) -> float:
    accelerator = Accelerator(device, precision)
    model = accelerator.convert_precision(make_model(width, device))
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    start = CLOCK[0]()
    for features, labels in batches:
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss = F.cross_entropy(model(features).float(), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    _sync(device)
    elapsed = CLOCK[0]() - start
    LAST_LOSS[precision] = loss.item()
    return len(batches) / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--fp8", action="store_true", help="also fp8 (torchao; emulated and slow without CUDA >= 8.9)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clock", choices=["cpu", "wall"], default=None,
                        help="cpu: process CPU time, one torch thread (default on CPU); wall: wall-clock time")
    args = parser.parse_args()
    device = torch.device(args.device)
    clock = args.clock or ("cpu" if device.type == "cpu" else "wall")
    if clock == "cpu":
        torch.set_num_threads(1)
        CLOCK[0] = time.process_time
    precisions = ["fp32", "bf16", "fp16"] + (["fp8"] if args.fp8 else [])
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch_size, args.width, generator=generator).to(device),
                torch.randint(0, 16, (args.batch_size,), generator=generator).to(device)) for _ in range(args.steps)]
    for precision in precisions:  # warm-up: first-call costs (kernel selection, torchao import) out of the figures
        plain_steps(precision, batches[:3], args.width, device)
        runner_steps(precision, batches[:3], args.width, device)
    results = {(loop, p): [] for loop in ("plain", "runner") for p in precisions}
    for round_index in range(args.rounds):
        for precision in precisions:
            # Swap who goes first each round, so neither loop always inherits a warm (or cold) cache.
            loops = [("plain", plain_steps), ("runner", runner_steps)][:: 1 if round_index % 2 == 0 else -1]
            for name, loop in loops:
                results[name, precision].append(loop(precision, batches, args.width, device))
    median = {key: statistics.median(values) for key, values in results.items()}
    print(f"device {device} ({torch.backends.cpu.get_cpu_capability() if device.type == 'cpu' else torch.cuda.get_device_name()}), "
          f"torch {torch.__version__}, MLP width {args.width}, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds, "
          f"{clock} clock")
    print(f"{'precision':<10}{'plain steps/s':>15}{'vs fp32':>9}{'runner steps/s':>16}{'vs fp32':>9}{'runner/plain':>14}"
          f"{f'loss@{args.steps}':>12}{'vs fp32':>10}")
    for precision in precisions:
        plain, runner = median["plain", precision], median["runner", precision]
        loss = LAST_LOSS[precision]
        print(f"{precision:<10}{plain:>15.1f}{plain / median['plain', 'fp32']:>9.2f}"
              f"{runner:>16.1f}{runner / median['runner', 'fp32']:>9.2f}{runner / plain:>14.2f}"
              f"{loss:>12.4f}{loss - LAST_LOSS['fp32']:>+10.4f}")


if __name__ == "__main__":
    main()
