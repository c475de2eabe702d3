"""The SLURM sweep launcher: the request derived from the hardware group, checked against the partition (recorded
sinfo / scontrol output, in-process), and the trial layouts it refuses. No SLURM cluster is needed: one test puts
stand-in `sinfo` and `scontrol` commands on PATH to see the sweep stop before it submits anything."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
from hydra import compose, initialize_config_dir

from runner.run import slurm
from runner.run.compose import CONFIG_DIR
from runner.run.resolvers import register_configs
from runner.errors import LaunchError
from runner.sweep.callback import check_slurm_request

register_configs()

# `sinfo --noheader --Node --format "%N|%P|%c|%m|%G|%l"` on a small cluster: a 4-CPU, 16 GB default partition and
# a GPU partition of two nodes (one of them also in `long`).
SINFO = """\
node01|debug*|4|15884|(null)|1:00:00
gpu01|gpu|32|257000|gpu:a100:4(S:0-1)|2-00:00:00
gpu02|gpu|32|257000+|gpu:a100:4(S:0-1)|2-00:00:00
gpu02|long|32|257000|gpu:a100:4(S:0-1)|infinite
"""
# `scontrol show partition gpu` (abridged): a per-job cap below the nodes' size.
SCONTROL_GPU = """\
PartitionName=gpu
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=NO QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO
   MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=24
   Nodes=gpu[01-02]
   State=UP TotalCPUs=64 TotalNodes=2 SelectTypeParameters=NONE
   DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
"""


def recorded(sinfo: str = SINFO, scontrol: str = ""):
    """subprocess.run as the check calls it, answering with recorded output."""
    def run(command, **kwargs):
        text = sinfo if command[0] == "sinfo" else scontrol
        return subprocess.CompletedProcess(command, 0, stdout=text, stderr="")
    return run


def request(**changes) -> slurm.Request:
    settings = dict(partition=None, nodes=1, tasks_per_node=1, cpus_per_task=8, mem_gb=32, gpus_per_node=None,
                    timeout_min=240)  # what hydra/launcher=slurm asked for before it followed the hardware group
    return slurm.Request(**{**settings, **changes})


def test_sinfo_output_gives_nodes_and_time_limit():
    """sinfo and scontrol output give each partition's nodes and time limit."""
    default = slurm.parse_sinfo(SINFO, None)
    assert default.name == "debug" and default.time_limit_min == 60
    assert default.nodes == (slurm.Node("node01", 4, 15884, 0),)
    gpu = slurm.parse_scontrol(SCONTROL_GPU, slurm.parse_sinfo(SINFO, "gpu"))
    assert [(node.cpus, node.memory_mb, node.gpus) for node in gpu.nodes] == [(32, 257000, 4), (32, 257000, 4)]
    assert gpu.time_limit_min == 2 * 24 * 60 and gpu.max_cpus_per_node == 24 and gpu.max_mem_per_node_mb is None
    assert slurm.parse_sinfo(SINFO, "long").time_limit_min is None
    assert slurm.parse_sinfo(SINFO, "nope") is None


@pytest.mark.parametrize(("text", "minutes"), [("30", 30), ("30:00", 30), ("4:00:00", 240), ("1-00:00:00", 1440),
                                               ("0:30:30", 31), ("infinite", None), ("UNLIMITED", None)])
def test_slurm_time_limits_in_minutes(text, minutes):
    assert slurm.parse_time_limit(text) == minutes


@pytest.mark.parametrize(("gres", "gpus"), [("(null)", 0), ("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4),
                                            ("gpu:a100:2,gpu:v100:2", 4), ("gpu:a100:2(S:0),shard:8", 2)])
def test_gpus_from_a_nodes_generic_resources(gres, gpus):
    assert slurm.parse_gpus(gres) == gpus


def test_unmeetable_request_names_it_and_the_limits():
    """A request the partition cannot meet is refused, naming the request and the partition's limits."""
    with pytest.raises(LaunchError) as refused:
        slurm.check_partition(request(), run=recorded())
    message = str(refused.value)
    assert message.startswith("hydra.launcher: SLURM cannot run these trials: each asks for 1 node with 8 CPUs, "
                              "32 GB, no GPU each, for 240 min, and partition debug has 1 node; its nodes have at most "
                              "4 CPUs, 15 GB (15884 MB) and no GPU; a time limit of 60 min (sinfo): ")
    assert "0 of its nodes can hold 8 CPUs, 32 GB and no GPU at once, and the trial needs 1" in message
    assert "240 min is above its time limit" in message
    assert "would pend forever" in message and "hydra.launcher.partition=NAME" in message


def test_request_above_per_job_cap_is_refused():
    """Above the partition's per-job cap (MaxCPUsPerNode) is refused; a request that fits passes."""
    with pytest.raises(LaunchError, match="32 CPUs per node is above its MaxCPUsPerNode") as refused:
        slurm.check_partition(request(partition="gpu", cpus_per_task=32, gpus_per_node=4), run=recorded(
            scontrol=SCONTROL_GPU))
    assert "at most 24 CPUs per node for a job (MaxCPUsPerNode)" in str(refused.value)
    fits = request(partition="gpu", cpus_per_task=16, mem_gb=64, gpus_per_node=4, nodes=2)
    assert slurm.check_partition(fits, run=recorded(scontrol=SCONTROL_GPU)).name == "gpu"
    small = request(cpus_per_task=2, mem_gb=8, timeout_min=60)  # the derived request of hardware=cpu
    assert slurm.check_partition(small, run=recorded()).name == "debug"


def test_unknown_partition_lists_the_known_ones():
    with pytest.raises(LaunchError, match=r"hydra.launcher.partition: sinfo lists no partition gpux; the partitions "
                                          r"are debug\*, gpu, long"):
        slurm.check_partition(request(partition="gpux"), run=recorded())


def test_no_sinfo_skips_the_check_with_a_log_line(monkeypatch, caplog):
    monkeypatch.setenv("PATH", "/nonexistent")
    with caplog.at_level(logging.INFO, logger="runner"):
        assert slurm.check_partition(request()) is None
    assert "sinfo not found: the SLURM request (1 node with 8 CPUs, 32 GB, no GPU each, for 240 min)" in caplog.text


def _slurm_sweep_config(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)


@pytest.mark.parametrize(("hardware", "cpus", "mem_gb", "gpus"), [
    (["hardware=cpu"], 2, 8, None),
    (["hardware=multi_cpu"], 4, 16, None),
    (["hardware=multi_cpu", "hardware.num_processes=4", "hardware.threads_per_process=1"], 4, 16, None),
    (["hardware=gpu"], 2, 8, 1),
    (["hardware=multi_gpu", "hardware.num_processes=4", "hardware.threads_per_process=8"], 32, 128, 4),
])
def test_the_slurm_request_follows_the_hardware_group(hardware, cpus, mem_gb, gpus):
    launcher = _slurm_sweep_config(*hardware).hydra.launcher
    assert (launcher.cpus_per_task, launcher.mem_gb, launcher.gpus_per_node) == (cpus, mem_gb, gpus)
    explicit = _slurm_sweep_config(*hardware, "hydra.launcher.cpus_per_task=6").hydra.launcher
    assert explicit.cpus_per_task == 6  # a number set on the command line wins


def test_several_tasks_per_trial_point_to_srun(capsys):
    """Several tasks per trial are refused, pointing at srun."""
    with pytest.raises(SystemExit) as exit_info:
        check_slurm_request(_slurm_sweep_config("hydra.launcher.tasks_per_node=2"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("runner: error: hydra.launcher.tasks_per_node is 2, but each task of a trial would run the "
                          "whole trial on its own")
    assert "hardware=multi_gpu hardware.num_processes=2" in err and "srun -n 2 python -m runner" in err


def test_several_nodes_need_multi_machine_overrides(capsys, monkeypatch):
    """Several nodes per trial need hardware.num_machines and the other multi-machine overrides."""
    with pytest.raises(SystemExit):
        check_slurm_request(_slurm_sweep_config("hydra.launcher.nodes=2"))
    assert "hydra.launcher.nodes is 2, but hardware.num_machines is 1" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")  # no sinfo here: the layout is what is judged
    check_slurm_request(_slurm_sweep_config("hydra.launcher.nodes=2", "hardware=multi_gpu",
                                            "hardware.num_processes=4", "hardware.num_machines=${oc.env:SLURM_NNODES}"))


def test_slurm_refuses_multi_gpu_without_processes(capsys):
    """hardware=multi_gpu without hardware.num_processes is refused under hydra/launcher=slurm."""
    with pytest.raises(SystemExit):
        check_slurm_request(_slurm_sweep_config("hardware=multi_gpu"))
    assert "hardware.num_processes: hardware=multi_gpu under hydra/launcher=slurm needs" in capsys.readouterr().err


FAKE_COMMAND = "#!/bin/sh\ncat {path}\n"


def test_unmeetable_sweep_submits_nothing(tmp_path):
    """A sweep whose request cannot be met stops within seconds and submits nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sinfo", SINFO), ("scontrol", "")):
        (tmp_path / f"{name}.txt").write_text(text)
        (bin_dir / name).write_text(FAKE_COMMAND.format(path=tmp_path / f"{name}.txt"))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", "hydra/launcher=slurm", "hardware=multi_cpu",
                           "hardware.threads_per_process=4", "optimizer.lr=1e-3,3e-4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert ("runner: error: hydra.launcher: SLURM cannot run these trials: each asks for 1 node with 8 CPUs, 32 GB, "
            "no GPU each, for 240 min, and partition debug has 1 node") in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list(tmp_path.rglob(".submitit"))  # nothing was submitted
    print(f"refused after {elapsed:.1f} s")  # python start-up and composition; the check itself is two commands
