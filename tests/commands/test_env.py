"""`python -m runner env`: the bug-report environment summary, on this machine and with stand-in GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import torch
import torch.distributed as torch_dist

from runner.commands import env


def test_report_names_versions_and_devices():
    """The report on the machine that runs the test."""
    report = env.report()
    assert report["version torch"] == torch.__version__.split("+")[0] or report["version torch"] == torch.__version__
    assert report["cpu capability"] == torch.backends.cpu.get_cpu_capability()
    assert report["cpu native bf16"] in ("yes", "no")
    assert report["cuda available"] == ("yes" if torch.cuda.is_available() else "no")
    assert report["gloo"] == "yes"
    assert report["version torchao"] != "not installed"  # the test extra installs it


def test_report_lists_gpus_with_bf16_and_fp8_support(monkeypatch):
    gpus = [types.SimpleNamespace(name="Stand-in H100", total_memory=80 * 2**30, major=9, minor=0),
            types.SimpleNamespace(name="Stand-in A100", total_memory=40 * 2**30, major=8, minor=0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpus[index])
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.cuda, "nccl", types.SimpleNamespace(version=lambda: (2, 21, 5)), raising=False)
    monkeypatch.setattr(torch_dist, "is_nccl_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    report = env.cuda_report()
    assert report["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert report["gpu count"] == "2" and report["nccl"] == "2.21.5" and report["cudnn"] == "90100"
    assert report["gpu 0"] == "Stand-in H100, 80.0 GiB, compute capability 9.0, bf16 yes, fp8 yes"
    assert report["gpu 1"] == "Stand-in A100, 40.0 GiB, compute capability 8.0, bf16 yes, fp8 no"


def test_python_m_runner_env_prints_lines_and_json():
    lines = subprocess.run([sys.executable, "-m", "runner", "env"], capture_output=True, text=True, check=True).stdout
    assert any(line.startswith("version torch") for line in lines.splitlines())
    as_json = subprocess.run([sys.executable, "-m", "runner", "env", "--json"], capture_output=True, text=True, check=True)
    report = json.loads(as_json.stdout)
    assert report["python"] == sys.version.split()[0] and "tpu (torch_xla)" in report
    from importlib import metadata

    assert report["version runner-ml"] == metadata.version("runner-ml")  # the distribution, not the import name
