"""Engines that start the runner on several nodes by their own contract, with no glue: Kubeflow Trainer's torch
runtime (torchrun in each pod, PET_* variables) and SkyPilot (the task's `run:` on each node, SKYPILOT_*
variables). Two "nodes" are two processes on 127.0.0.1 given exactly the variables each engine sets; each run must
be one group with one run dir named by the engine's job, ending with the weights of `hardware=multi_cpu` on one
machine at the same global batch."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from conftest import ROOT, communicate_all, free_port, run_cli, run_dirs_under

SMALL = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=32", "trainer.max_steps=4",
         "trainer.log_every_steps=1", "trainer.progress_bar=false", "hardware.timeout_s=120",
         "hardware.threads_per_process=1")  # the same threads on every layout: bitwise comparable


def _docs_example(marker: str) -> dict:
    """The YAML example of docs/distributed.md that contains `marker`, parsed: the tests run what the docs ship."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "docs" / "distributed.md").read_text(), re.S | re.M)
    (block,) = [block for block in blocks if marker in block]
    return yaml.safe_load(block)


def _on_cpu(command: list[str]) -> list[str]:
    """The docs' command for GPU nodes, on this machine's CPUs: multi_gpu -> multi_cpu, nothing else changed."""
    return [word.replace("hardware=multi_gpu", "hardware=multi_cpu") for word in command]


def _nodes(commands: list[list[str]], envs: list[dict], cwd: Path) -> list[tuple[int, str]]:
    """Start one process per node (all in `cwd`: the volume every node of the job mounts), wait for all."""
    started = [subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for command, env in zip(commands, envs)]
    return [(code, output) for code, output, _ in communicate_all(started)]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "export" / "final.safetensors")


def _one_machine_reference(tmp_path: Path) -> dict[str, torch.Tensor]:
    cwd = tmp_path / "one_machine"
    cwd.mkdir()
    result = run_cli("hardware=multi_cpu", "hardware.start_method=fork", *SMALL, cwd=cwd)
    assert result.returncode == 0, result.output
    return _weights(result.run_dir())


def _assert_same_weights(run_dir: Path, reference: dict[str, torch.Tensor]) -> None:
    trained = _weights(run_dir)
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(trained[name], value), name


def test_kubeflow_pods_are_ranks_of_one_run(tmp_path):
    """Kubeflow Trainer's torch runtime: `torchrun -m runner ...` in each pod, with PET_NNODES, PET_NPROC_PER_NODE,
    PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT (torchrun reads them as its own flags)."""
    reference = _one_machine_reference(tmp_path)
    cwd, port = tmp_path / "shared_volume", free_port()
    cwd.mkdir()
    command = _on_cpu(_docs_example("kind: TrainJob")["spec"]["trainer"]["command"])
    assert command[0] == "torchrun"
    pod = [sys.executable, "-m", "torch.distributed.run", *command[1:], *SMALL]  # torchrun of this venv
    envs = [{"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(node),
             "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)} for node in (0, 1)]
    results = _nodes([pod, pod], envs, cwd)
    for code, output in results:
        assert code == 0, output
    (run_dir,) = run_dirs_under(cwd)
    assert run_dir.name == f"kubeflow-127.0.0.1-{port}"  # the rendezvous Kubeflow names after the TrainJob
    log1 = (run_dir / "runner_rank1.log").read_text()
    assert "rank 1 of 2 (local rank 0)" in log1 and "node 1 of 2" in log1 and "started by torchrun" in log1
    _assert_same_weights(run_dir, reference)


def test_skypilot_nodes_are_machines_of_one_run(tmp_path):
    """SkyPilot: the task's `run:` (`python -m runner hardware=multi_cpu ...`) on each node, with SKYPILOT_NODE_RANK,
    SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE and SKYPILOT_TASK_ID; no torchrun."""
    reference = _one_machine_reference(tmp_path)
    cwd = tmp_path / "shared_volume"
    cwd.mkdir()
    (run_line,) = _docs_example("num_nodes:")["run"].strip().splitlines()
    command = _on_cpu(shlex.split(run_line))
    assert command[:3] == ["python", "-m", "runner"]
    node = [sys.executable, *command[1:], "hardware.start_method=fork", "hardware.num_processes=1", *SMALL]
    # A task id whose derived port is free here (SkyPilot gives no port; every node derives the same one).
    task = next(task for task in (f"sky-2026-12-05-{n}_train_1" for n in range(1000))
                if _port_is_free(_derived_port(task)))
    envs = [{"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1",
             "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": task}
            for rank in (0, 1)]
    results = _nodes([node, node], envs, cwd)
    for code, output in results:
        assert code == 0, output
    (run_dir,) = run_dirs_under(cwd)
    assert run_dir.name == f"skypilot-{task}"
    log0, log1 = ((run_dir / f"runner_rank{rank}.log").read_text() for rank in (0, 1))
    assert "node 0 of 2" in log0 and "node 1 of 2" in log1 and "started by skypilot" in log1
    _assert_same_weights(run_dir, reference)


def _derived_port(task_id: str) -> int:
    from runner.distributed.dist import skypilot_machine_overrides

    env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_TASK_ID": task_id}
    (port,) = [item for item in skypilot_machine_overrides([], env) if item.startswith("hardware.main_process_port")]
    return int(port.split("=")[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_node_that_would_train_alone_is_refused(tmp_path):
    """A SkyPilot job on 2 nodes whose command says one machine: each node would train alone as rank 0 of its own
    run (what Accelerate users report); refused before training, naming the variable and the fix."""
    env = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_TASK_ID": "sky-alone"}
    result = run_cli("hardware=multi_cpu", "hardware.start_method=fork", "hardware.num_machines=1", *SMALL,
                     cwd=tmp_path, env=env)
    assert result.returncode == 1, result.output
    assert "skypilot started this job on 2 nodes (SKYPILOT_NUM_NODES=2), but this process is rank 0 of a run on " \
           "1 machine(s)" in result.stderr, result.stderr[-3000:]
    assert "each node would train alone" in result.stderr
    assert not list((tmp_path / "outputs").rglob("checkpoints"))


def test_engines_are_read_in_a_fixed_order():
    """torchrun, then SLURM's srun tasks, then Kubeflow, then SkyPilot; the job id comes from the scheduler."""
    from runner.distributed.dist import Engine, detect_engine

    pet = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}
    sky = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_TASK_ID": "sky-1"}
    assert detect_engine({}) == Engine("none")
    assert detect_engine({**pet, "TORCHELASTIC_RUN_ID": "none"}) == \
        Engine("torchrun", "kubeflow-job-node-0-0.job-29400", 2, 1)
    assert detect_engine({**sky, "TORCHELASTIC_RUN_ID": "my-id"}).job_id == "my-id"  # torchrun's own id first
    assert detect_engine({**sky, "TORCHELASTIC_RUN_ID": "runner"}) == Engine("skypilot", "skypilot-sky-1", 2, 1)
    assert detect_engine(pet) == Engine("kubeflow", "kubeflow-job-node-0-0.job-29400", 2, 1)
    assert detect_engine({**pet, **sky}).name == "kubeflow"


def test_skypilot_overrides_leave_given_keys_alone():
    from runner.distributed.dist import skypilot_machine_overrides

    env = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_TASK_ID": "sky-1"}
    added = skypilot_machine_overrides(["hardware=multi_gpu", "hardware.main_process_port=1234"], env)
    assert added == ["hardware.num_machines=2", "hardware.machine_rank=1", "hardware.main_process_ip=10.0.0.1"]
    assert skypilot_machine_overrides(["hardware.num_machines=1"], env) == []  # the command line took charge
    assert skypilot_machine_overrides([], {**env, "SKYPILOT_NUM_NODES": "1"}) == []  # one node: nothing to meet
    assert skypilot_machine_overrides([], {**env, "TORCHELASTIC_RUN_ID": "none"}) == []  # torchrun's flags say it
