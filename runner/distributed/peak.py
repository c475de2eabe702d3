"""The peak FLOP/s of one device, the denominator of MFU (model FLOPs utilisation).

GPUs: the vendor's dense (no sparsity) tensor-core figure for the precision, from a table of known models; fp32
counts as TF32 when torch lets matmuls use it. CPUs: there is no datasheet figure for a shared, throttled core, so
the peak is a square matmul in the run's compute dtype, timed with the threads this process has, the best of a few
repeats; measured at first use and cached per machine (CPU model, threads, dtype) in
`$RUNNER_CACHE_HOME/peak_flops.json`, by default `~/.cache/runner/peak_flops.json` (delete it to measure
again). Other devices (XLA): unknown, no MFU.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from runner.ground import write_text_atomically

TERA = 1e12
# Dense TFLOP/s from NVIDIA's datasheets (the sparse figures are twice these). Name fragments are tried in order,
# the most specific first: torch.cuda.get_device_name gives e.g. "NVIDIA H100 80GB HBM3" (SXM) or "NVIDIA H100 PCIe".
GPU_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}),
    ("V100", {"fp32": 15.7, "fp16": 125.0}),
)
CPU_MATMUL_SIZE = 1024
"""The side of the square matmul timed on a CPU: 2.1 GFLOP, large enough for the BLAS kernels' peak."""
CPU_REPEATS = 5
CPU_PRODUCT_BUDGET_S = 0.25
"""At most this long for one timed product, as the last smaller square predicts it: a dtype the CPU only emulates is
timed on a smaller square. fp16 on an AVX2 CPU computes about 1 GFLOP/s at 1024x1024 (2 s a product, 12 s for the
six a measurement takes, at the start of a run) against 90-200 GFLOP/s for float32 and native bfloat16."""


@dataclass(frozen=True)
class Peak:
    """FLOP/s of one device at the precision a run computes in (None: unknown) and where the figure comes from."""

    flops_per_s: float | None
    source: str


def device_peak(device: torch.device, precision: str, cache_dir: Path | None = None) -> Peak:
    """The peak of `device` for `precision` (fp32, bf16, fp16, fp8)."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), precision, tf32_allowed())
    if device.type == "cpu":
        return cpu_peak(precision, torch.get_num_threads(), cache_dir or default_cache_dir())
    return Peak(None, f"the peak FLOP/s of a {device.type} device is not known to the runner")


def tf32_allowed() -> bool:
    return torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"


def gpu_peak(name: str, precision: str, tf32: bool = False) -> Peak:
    column = "tf32" if precision == "fp32" and tf32 else precision
    for fragment, figures in GPU_PEAK_TFLOPS:
        if fragment in name:
            if column not in figures:
                return Peak(None, f"{name} has no {column} tensor-core figure in runner/distributed/peak.py")
            return Peak(figures[column] * TERA, f"{name}'s {column} datasheet figure, dense")
    return Peak(None, f"{name} is not in runner/distributed/peak.py's table of GPUs (add its datasheet figures)")


def default_cache_dir() -> Path:
    """$RUNNER_CACHE_HOME, else $XDG_CACHE_HOME/runner, else ~/.cache/runner."""
    if os.environ.get("RUNNER_CACHE_HOME"):
        return Path(os.environ["RUNNER_CACHE_HOME"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "runner"


COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float32}
"""The dtype a CPU's matmuls run in for each precision (fp8 is emulated in fp32 on a CPU)."""


def cpu_peak(precision: str, threads: int, cache_dir: Path) -> Peak:
    dtype = COMPUTE_DTYPES.get(precision, torch.float32)
    key = f"{cpu_model()} | {threads} thread(s) | {str(dtype).removeprefix('torch.')}"
    cache = cache_dir / "peak_flops.json"
    known = _read_json(cache)
    if key not in known:
        flops, size = measure_matmul_flops(dtype)
        known[key] = {"flops_per_s": flops, "size": size}
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomically(cache, json.dumps(known, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # an unwritable cache only costs measuring again next time
        how = "measured now"
    else:
        how = f"measured earlier, cached in {cache}"
    size = known[key]["size"]
    return Peak(known[key]["flops_per_s"], f"a {size}x{size} {str(dtype).removeprefix('torch.')} matmul on "
                                           f"{threads} thread(s), {how}")


def measure_matmul_flops(dtype: torch.dtype, size: int = CPU_MATMUL_SIZE, repeats: int = CPU_REPEATS,
                         budget_s: float = CPU_PRODUCT_BUDGET_S) -> tuple[float, int]:
    """(the best FLOP/s of square matmuls, their side): squares from 128 up to `size`, doubling the side while the
    last one measured predicts that the next product takes at most `budget_s`. Upward, because a small product can
    be far slower per FLOP than a large one (fp16 on 2 threads of an AVX512 CPU: 0.3 GFLOP/s at 128x128, 78 at
    1024x1024): predicting from 128x128 alone timed fp16 there on 256x256 and put its peak 20x too low."""
    best, best_side, side = 0.0, 128, 128
    while True:
        seconds = _matmul_seconds(dtype, side, repeats)
        flops = 2 * side**3 / max(seconds, 1e-9)
        if flops >= best * (1 - 1e-9):  # a tie goes to the larger square
            best, best_side = flops, side
        if side * 2 > size or seconds * 8 > budget_s:
            return best, best_side
        side *= 2


def _matmul_seconds(dtype: torch.dtype, size: int, repeats: int) -> float:
    """The fastest of `repeats` timed products of two size x size matrices, after one untimed."""
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = a.t().contiguous()
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return best


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def _read_json(path: Path) -> dict[str, dict]:
    """The cached peaks, {key: {"flops_per_s", "size"}}; an entry of an older runner (a bare number, measured on a
    1024x1024 square) is read as such; anything else is measured again."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    entries = {}
    for key, value in known.items():
        if isinstance(value, (int, float)):
            value = {"flops_per_s": value, "size": CPU_MATMUL_SIZE}
        if (isinstance(value, dict) and isinstance(value.get("flops_per_s"), (int, float))
                and value["flops_per_s"] > 0 and isinstance(value.get("size"), int)):
            entries[key] = value
    return entries
