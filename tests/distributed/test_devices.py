"""Devices: one resolved Hardware from hardware + gpu_ids + the environment: gpu_ids parsing and selection against
CUDA_VISIBLE_DEVICES and the GPUs present (stood in for on CPU), the physical id -> rank -> device table, auto, TPU,
external launchers, and the CLI reporting every problem at once."""

from __future__ import annotations

import pickle
import sys
import types

import pytest
import torch

from runner.distributed import devices
from runner.config import HardwareConfig, HardwareKind
from runner.distributed.devices import parse_gpu_ids, resolve_hardware
from runner.errors import HardwareError

from conftest import TINY


@pytest.fixture
def four_gpus(monkeypatch):
    """A machine with 4 GPUs as NVML sees them, CUDA usable, and no CUDA_VISIBLE_DEVICES set."""
    monkeypatch.setattr(devices, "physical_gpu_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # setenv first so monkeypatch restores the variable after tests that export it (delenv alone records nothing
    # when it is unset).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")


def _resolve(kind: HardwareKind, gpu_ids=None, processes: int | None = None) -> devices.Hardware:
    return resolve_hardware(HardwareConfig(kind=kind, num_processes=processes), gpu_ids)


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


def test_one_resolved_description_of_the_hardware(four_gpus):
    hardware = _resolve(HardwareKind.multi_gpu, [3, 1])
    assert (hardware.kind, hardware.device_type, hardware.backend) == (HardwareKind.multi_gpu, "cuda", "nccl")
    assert hardware.processes_per_machine == 2 and hardware.world_size == 2  # one per selected GPU
    assert hardware.multi_process and hardware.launches_processes and not hardware.external_launcher
    assert hardware.cuda_visible_devices == "3,1" and hardware.problems == ()
    assert hardware.gpu_table().splitlines()[1:] == ["  physical 3 -> rank 0 -> cuda:0", "  physical 1 -> rank 1 -> cuda:1"]
    assert pickle.loads(pickle.dumps(hardware)) == hardware  # what the launcher hands each worker
    cpu = _resolve(HardwareKind.multi_cpu)
    assert (cpu.device_type, cpu.backend, cpu.processes_per_machine) == ("cpu", "gloo", 2)


def test_apply_exports_the_selection(four_gpus):
    _resolve(HardwareKind.gpu, "2").apply()
    from runner.distributed.dist import cuda_visible_devices

    assert cuda_visible_devices() == "2"


def test_apply_changes_nothing_on_problems(four_gpus):
    """apply() changes nothing when the selection has problems."""
    hardware = _resolve(HardwareKind.gpu, [9])
    hardware.apply()
    from runner.distributed.dist import cuda_visible_devices

    assert hardware.problems and cuda_visible_devices() is None


def test_gpu_ids_out_of_range_lists_the_gpus_present(four_gpus):
    (problem,) = _resolve(HardwareKind.gpu, [4]).problems
    assert problem.key == "gpu_ids"
    assert "[4] names GPUs this machine does not have; it has 4 GPU(s): 0, 1, 2, 3" in problem.message


def test_all_gpus_by_default(four_gpus):
    hardware = _resolve(HardwareKind.multi_gpu, None)
    assert hardware.cuda_visible_devices is None and hardware.physical_gpus == ("0", "1", "2", "3")
    assert hardware.processes_per_machine == 4
    (problem,) = _resolve(HardwareKind.multi_gpu, "all", processes=5).problems
    assert problem.key == "hardware.num_processes" and "only 4 GPU(s) are available" in problem.message


def test_gpu_count_must_match_the_process_count(four_gpus):
    (problem,) = _resolve(HardwareKind.multi_gpu, [0, 1], processes=3).problems
    assert "selects 2 GPU(s) (0,1) for 3 process(es)" in problem.message and "hardware.num_processes=2" in problem.message
    (problem,) = _resolve(HardwareKind.gpu, [0, 1]).problems
    assert "use hardware=multi_gpu hardware.num_processes=2" in problem.message


def test_inherited_cuda_visible_devices_is_kept(four_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # e.g. set by SLURM
    kept = _resolve(HardwareKind.multi_gpu, None)
    assert kept.cuda_visible_devices is None and kept.physical_gpus == ("2", "3") and kept.problems == ()
    narrowed = _resolve(HardwareKind.gpu, [3])
    assert narrowed.cuda_visible_devices == "3" and narrowed.gpu_table().splitlines()[1] == "  physical 3 -> rank 0 -> cuda:0"


@pytest.mark.parametrize("inherited", ["2,3", "GPU-8f3c2a1e-0000-0000-0000-000000000000"])
def test_conflicting_gpu_ids_is_an_error(four_gpus, monkeypatch, inherited):
    """An error, not an override of the inherited CUDA_VISIBLE_DEVICES."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", inherited)
    (problem,) = _resolve(HardwareKind.gpu, [0]).problems
    assert f"[0] conflicts with CUDA_VISIBLE_DEVICES='{inherited}'" in problem.message
    assert "unset CUDA_VISIBLE_DEVICES" in problem.message


def test_cpu_runs_ignore_gpu_ids_unless_malformed(four_gpus):
    assert _resolve(HardwareKind.cpu, [7]).problems == ()
    assert _resolve(HardwareKind.cpu, "x").problems[0].key == "gpu_ids"


def test_torchrun_decides_the_process_counts(monkeypatch):
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    hardware = _resolve(HardwareKind.multi_cpu, processes=8)
    assert hardware.external_launcher and not hardware.launches_processes
    assert (hardware.processes_per_machine, hardware.num_machines, hardware.world_size) == (2, 2, 4)


def test_torchrun_ignores_num_processes_with_a_log(monkeypatch, caplog):
    # torchrun on 2 nodes, one process each, with hardware=multi_cpu (whose file sets num_processes: 2).
    for name, value in {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level("INFO", logger="runner.distributed.devices"):
        hardware = _resolve(HardwareKind.multi_cpu, processes=2)
    assert hardware.problems == ()
    assert (hardware.processes_per_machine, hardware.num_machines) == (1, 2)
    assert "hardware.num_processes=2 is ignored: the launcher (torchrun or srun) started 1 process(es) on this " \
           "machine" in caplog.text


def test_a_cpu_only_torch_build_counts_no_gpus(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert devices.physical_gpu_count() == 0 and not devices.cuda_present()


def test_auto_picks_gpu_if_cuda_and_says_which(monkeypatch, caplog):
    monkeypatch.setattr(devices, "cuda_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    caplog.set_level("INFO", logger="runner.distributed.devices")
    hardware = _resolve(HardwareKind.auto)
    assert hardware.kind is HardwareKind.gpu and hardware.device(1) == torch.device("cuda", 1)
    assert "hardware=auto: CUDA is present, using the GPU" in caplog.text
    monkeypatch.setattr(devices, "cuda_present", lambda: False)
    hardware = _resolve(HardwareKind.auto)
    assert hardware.kind is HardwareKind.cpu and hardware.device(0) == torch.device("cpu")
    assert "no CUDA GPU, using the CPU" in caplog.text


def test_a_rank_without_its_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(HardwareError, match="local rank 1 needs cuda:1, but this process sees 1 GPU"):
        devices.Hardware(HardwareKind.multi_gpu, "cuda", 2).device(1)


def test_tpu_without_torch_xla_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)
    problems = _resolve(HardwareKind.tpu, processes=2).problems
    assert problems[0].key == "hardware" and "tpu needs torch_xla" in problems[0].message
    assert "install the torch_xla build that matches your torch" in problems[0].message
    assert problems[1].key == "hardware.num_processes"


def test_tpu_with_torch_xla_uses_its_device(monkeypatch):
    from runner.accelerate.accelerator import Accelerator

    fake = types.ModuleType("torch_xla")
    fake.device = lambda: torch.device("cpu")
    for name in ("torch_xla", "torch_xla.core.xla_model", "torch_xla.distributed.parallel_loader"):
        monkeypatch.setitem(sys.modules, name, fake)
    hardware = _resolve(HardwareKind.tpu)
    assert hardware.problems == () and hardware.device_type == "xla"
    accelerator = Accelerator(hardware=hardware)
    assert accelerator.xla is not None and accelerator.device == torch.device("cpu")


def test_cli_reports_every_device_problem_at_once(cli):
    """Device and precision problems (and others) are reported together, at once."""
    result = cli(*TINY, "hardware=gpu", "gpu_ids=[7]", "precision=fp8", "trainer.grad_accum_steps=0")
    assert result.returncode == 1
    assert "bad config (4 problems)" in result.stderr
    for text in ("trainer.grad_accum_steps: is 0", "gpu_ids: [7] names GPUs this machine does not have",
                 "hardware: gpu needs a CUDA GPU", "precision.fp8_emulation: precision=fp8 needs a CUDA GPU"):
        assert text in result.stderr
    assert "Traceback" not in result.stderr and result.run_dirs() == []


def test_cli_refuses_gpu_ids_that_conflict_with_env(cli):
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


def test_hardware_tpu_runs_the_worker_via_torch_xla(cli, tmp_path):
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


def test_start_method_auto_forks_cpu_spawns_cuda(monkeypatch):
    """auto forks CPU workers on Linux (spawns elsewhere) and spawns for CUDA."""
    from runner.config import HardwareConfig, HardwareKind, StartMethod
    from runner.distributed.devices import _start_method, resolve_hardware

    assert resolve_hardware(HardwareConfig(kind=HardwareKind.multi_cpu)).start_method is (
        StartMethod.fork if sys.platform.startswith("linux") else StartMethod.spawn)
    assert _start_method(StartMethod.auto, "cuda") is StartMethod.spawn
    assert _start_method(StartMethod.spawn, "cpu") is StartMethod.spawn  # asked for: kept
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _start_method(StartMethod.auto, "cpu") is StartMethod.spawn


def test_gpu_ids_on_a_cpu_run_are_said_to_be_unused(caplog):
    """They were ignored without a word (config.yaml still recorded them); a machine default is not refused."""
    hardware = resolve_hardware(HardwareConfig(kind=HardwareKind.multi_cpu, num_processes=2), [0, 1])
    assert hardware.problems == () and hardware.device_type == "cpu"
    assert "gpu_ids=[0, 1] is not used: this run's hardware runs on the CPU, not on GPUs" in caplog.text
