"""Devices: gpu_ids parsing and selection against CUDA_VISIBLE_DEVICES and the GPUs present (stood in for on CPU),
the physical id -> rank -> device table, auto, TPU checks, and the CLI reporting every problem at once."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from runner import devices
from runner.config import HardwareKind
from runner.devices import apply_gpus, device_for, hardware_problems, parse_gpu_ids, select_gpus
from runner.dist import DistInfo
from runner.errors import HardwareError

from conftest import TINY


@pytest.fixture
def four_gpus(monkeypatch):
    """A machine with 4 GPUs as NVML sees them, and no CUDA_VISIBLE_DEVICES set."""
    monkeypatch.setattr(devices, "physical_gpu_count", lambda: 4)
    # setenv first so monkeypatch restores the variable after tests that export it (delenv alone records nothing
    # when it is unset).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize("value, ids", [
    (None, None), ("all", None), ("ALL", None), (1, [1]), ([0, 2], [0, 2]), ("0,2", [0, 2]), (" 3 , 1 ", [3, 1]),
])
def test_parse_gpu_ids(value, ids):
    assert parse_gpu_ids(value) == ids


@pytest.mark.parametrize("value, message", [
    ("0;2", "is not a GPU selection; use all, a list of GPU indices like [0,2]"),
    ([0, -1], "is not a GPU selection"),
    ([True], "is not a GPU selection"),
    ("1,1", "names a GPU more than once"),
])
def test_parse_gpu_ids_rejects_with_what_is_accepted(value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_gpu_ids(value)


def test_gpu_ids_become_cuda_visible_devices_and_a_table(four_gpus):
    selection = select_gpus(HardwareKind.multi_gpu, [3, 1], num_processes=2)
    assert selection.problems == [] and selection.export == "3,1"
    assert selection.table(2).splitlines()[1:] == ["  physical 3 -> rank 0 -> cuda:0", "  physical 1 -> rank 1 -> cuda:1"]


def test_apply_exports_the_selection(four_gpus):
    apply_gpus(select_gpus(HardwareKind.gpu, "2", num_processes=1))
    from runner.dist import cuda_visible_devices

    assert cuda_visible_devices() == "2"


def test_apply_changes_nothing_when_the_selection_has_problems(four_gpus):
    apply_gpus(select_gpus(HardwareKind.gpu, [9], num_processes=1))
    from runner.dist import cuda_visible_devices

    assert cuda_visible_devices() is None


def test_gpu_ids_out_of_range_lists_the_gpus_present(four_gpus):
    (problem,) = select_gpus(HardwareKind.gpu, [4], num_processes=1).problems
    assert problem.key == "gpu_ids"
    assert "[4] names GPUs this machine does not have; it has 4 GPU(s): 0, 1, 2, 3" in problem.message


def test_all_gpus_by_default(four_gpus):
    selection = select_gpus(HardwareKind.multi_gpu, None, num_processes=4)
    assert selection.export is None and selection.physical == ["0", "1", "2", "3"]
    (problem,) = select_gpus(HardwareKind.multi_gpu, "all", num_processes=5).problems
    assert problem.key == "hardware.num_processes" and "only 4 GPU(s) are available" in problem.message


def test_gpu_count_must_match_the_process_count(four_gpus):
    (problem,) = select_gpus(HardwareKind.multi_gpu, [0, 1], num_processes=3).problems
    assert "selects 2 GPU(s) (0,1) for 3 process(es)" in problem.message and "hardware.num_processes=2" in problem.message
    (problem,) = select_gpus(HardwareKind.gpu, [0, 1], num_processes=1).problems
    assert "use hardware=multi_gpu hardware.num_processes=2" in problem.message


def test_an_inherited_cuda_visible_devices_is_respected(four_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # e.g. set by SLURM
    kept = select_gpus(HardwareKind.multi_gpu, None, num_processes=2)
    assert kept.export is None and kept.physical == ["2", "3"] and kept.problems == []
    narrowed = select_gpus(HardwareKind.gpu, [3], num_processes=1)
    assert narrowed.export == "3" and narrowed.table(1).splitlines()[1] == "  physical 3 -> rank 0 -> cuda:0"


@pytest.mark.parametrize("inherited", ["2,3", "GPU-8f3c2a1e-0000-0000-0000-000000000000"])
def test_a_conflicting_gpu_ids_is_an_error_not_an_override(four_gpus, monkeypatch, inherited):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", inherited)
    (problem,) = select_gpus(HardwareKind.gpu, [0], num_processes=1).problems
    assert f"[0] conflicts with CUDA_VISIBLE_DEVICES='{inherited}'" in problem.message
    assert "unset CUDA_VISIBLE_DEVICES" in problem.message


def test_cpu_runs_ignore_gpu_ids_but_still_reject_malformed_ones(four_gpus):
    assert select_gpus(HardwareKind.cpu, [7], num_processes=1).problems == []
    assert select_gpus(HardwareKind.cpu, "x", num_processes=1).problems[0].key == "gpu_ids"


def test_a_cpu_only_torch_build_counts_no_gpus(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert devices.physical_gpu_count() == 0 and not devices.cuda_present()


def test_auto_means_gpu_when_cuda_is_present_and_says_which(monkeypatch, caplog):
    monkeypatch.setattr(devices, "cuda_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    caplog.set_level("INFO", logger="runner.devices")
    assert device_for(HardwareKind.auto, DistInfo(rank=1, local_rank=1, world_size=2)) == torch.device("cuda", 1)
    assert "hardware=auto: CUDA is present, using the GPU" in caplog.text
    monkeypatch.setattr(devices, "cuda_present", lambda: False)
    assert device_for(HardwareKind.auto, DistInfo()) == torch.device("cpu")
    assert "no CUDA GPU, using the CPU" in caplog.text


def test_a_rank_without_its_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(HardwareError, match="local rank 1 needs cuda:1, but this process sees 1 GPU"):
        device_for(HardwareKind.multi_gpu, DistInfo(rank=1, local_rank=1, world_size=2))


def test_tpu_without_torch_xla_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)
    problems = hardware_problems(HardwareKind.tpu, num_processes=2)
    assert problems[0].key == "hardware" and "tpu needs torch_xla" in problems[0].message
    assert "install the torch_xla build that matches your torch" in problems[0].message
    assert problems[1].key == "hardware.num_processes"


def test_tpu_with_torch_xla_uses_its_device(monkeypatch):
    fake = types.ModuleType("torch_xla")
    fake.device = lambda: torch.device("cpu")
    for name in ("torch_xla", "torch_xla.core.xla_model", "torch_xla.distributed.parallel_loader"):
        monkeypatch.setitem(sys.modules, name, fake)
    assert hardware_problems(HardwareKind.tpu) == []
    assert device_for(HardwareKind.tpu, DistInfo()) == torch.device("cpu")


def test_the_cli_reports_every_device_and_precision_problem_at_once(cli):
    result = cli(*TINY, "hardware=gpu", "gpu_ids=[7]", "precision=fp8", "trainer.grad_accum_steps=0")
    assert result.returncode == 1
    assert "bad config (4 problems)" in result.stderr
    for text in ("trainer.grad_accum_steps: is 0", "gpu_ids: [7] names GPUs this machine does not have",
                 "hardware: gpu needs a CUDA GPU", "precision.fp8_emulation: precision=fp8 needs a CUDA GPU"):
        assert text in result.stderr
    assert "Traceback" not in result.stderr and result.run_dirs() == []


def test_the_cli_refuses_gpu_ids_that_conflict_with_the_environment(cli):
    result = cli(*TINY, "hardware=gpu", "gpu_ids=[1]", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert result.returncode == 1
    assert "gpu_ids: [1] conflicts with CUDA_VISIBLE_DEVICES='0'" in result.stderr


FAKE_TORCH_XLA = {
    "__init__.py": (
        "import os, torch\n"
        "def _record(call):\n"
        "    with open(os.environ['FAKE_XLA_LOG'], 'a') as log:\n"
        "        log.write(call + '\\n')\n"
        "def device():\n"
        "    _record('device')\n"
        "    return torch.device('cpu')\n"
        "def sync():\n"
        "    _record('sync')\n"
    ),
    "core/__init__.py": "",
    "core/xla_model.py": (
        "from torch_xla import _record\n"
        "def optimizer_step(optimizer):\n"
        "    _record('optimizer_step')\n"
        "    optimizer.step()\n"
    ),
    "distributed/__init__.py": "",
    "distributed/parallel_loader.py": (
        "from torch_xla import _record\n"
        "class MpDeviceLoader:\n"
        "    def __init__(self, loader, device):\n"
        "        _record('MpDeviceLoader')\n"
        "        self.loader = loader\n"
        "    def __iter__(self):\n"
        "        return iter(self.loader)\n"
    ),
}


def test_hardware_tpu_runs_the_whole_worker_through_torch_xla_calls(cli, tmp_path):
    """A stand-in torch_xla package (on PYTHONPATH) records what a run calls: the real TPU path, executed on CPU."""
    import os

    for name, text in FAKE_TORCH_XLA.items():
        path = tmp_path / "fake" / "torch_xla" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    calls = tmp_path / "calls.txt"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]),
           "FAKE_XLA_LOG": str(calls)}
    result = cli(*TINY, "hardware=tpu", "trainer.max_steps=2", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.output
    recorded = calls.read_text().split()
    assert recorded.count("optimizer_step") == 2 and recorded.count("sync") == 2
    assert recorded.count("MpDeviceLoader") == 2  # the train and validation batches
    assert "precision fp32" in (result.run_dir() / "runner.log").read_text()
