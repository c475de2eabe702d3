"""`python -m runner env`: what to paste into a bug report (versions, devices, bf16/fp8 support, CUDA/NCCL).

    python -m runner env          # one `key: value` line each
    python -m runner env --json   # the same as one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata

import torch
import torch.distributed as torch_dist

from runner.distributed import dist
from runner.accelerate.precision import FP8_MIN_CAPABILITY, cpu_has_native_bf16

PACKAGES = ("runner-ml", "torch", "hydra-core", "omegaconf", "datasets", "tensorboard", "safetensors", "torchao",
            "torch_xla")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_report() -> dict[str, str]:
    return {
        "cpu capability": torch.backends.cpu.get_cpu_capability(),
        "cpu cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "cpu native bf16": _yes_no(cpu_has_native_bf16()),
    }


def cuda_report() -> dict[str, str]:
    report = {
        "torch cuda build": torch.version.cuda or ("rocm " + torch.version.hip if torch.version.hip else "none (CPU-only build)"),
        "CUDA_VISIBLE_DEVICES": dist.cuda_visible_devices() or "(unset)",
        "cuda available": _yes_no(torch.cuda.is_available()),
    }
    if not torch.cuda.is_available():
        return report
    report["cudnn"] = str(torch.backends.cudnn.version())
    report["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch_dist.is_nccl_available() else "unavailable"
    report["gpu count"] = str(torch.cuda.device_count())
    for index in range(torch.cuda.device_count()):
        report[f"gpu {index}"] = gpu_line(index)
    return report


def gpu_line(index: int) -> str:
    """Name, memory, compute capability and which low precisions run natively on one visible GPU."""
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    bf16 = capability >= (8, 0)
    fp8 = capability >= FP8_MIN_CAPABILITY
    return (f"{props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability {props.major}.{props.minor}, "
            f"bf16 {_yes_no(bf16)}, fp8 {_yes_no(fp8)}")


def report() -> dict[str, str]:
    from runner.distributed.devices import xla_problem

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **{f"version {name}": version for name, version in package_versions().items()},
        **cpu_report(),
        **cuda_report(),
        "gloo": _yes_no(torch_dist.is_gloo_available()),
        "tpu (torch_xla)": "usable" if xla_problem() is None else xla_problem().split(";")[0],
    }


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="runner env", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of key: value lines")
    args = parser.parse_args(argv)
    lines = report()
    if args.json:
        print(json.dumps(lines, indent=2))
    else:
        width = max(map(len, lines))
        print("\n".join(f"{key:<{width}} : {value}" for key, value in lines.items()))


if __name__ == "__main__":
    main()
