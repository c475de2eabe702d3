"""hardware.launcher=ray on a real local Ray cluster (ray.init() started by the run, 2 CPU workers): Ray Train's
TorchTrainer starts the workers and joins their process group; the runner trains in it. One run dir, the weights of
`hardware=multi_cpu` at the same global batch, and a worker killed mid-run that Ray restarts, ending bit-exact."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, WAIT_S, PipeReader, run_cli

SMALL = ("hardware=multi_cpu", "data.num_train=256", "data.num_validation=64", "trainer.batch_size=32",
         "trainer.log_every_steps=1", "trainer.progress_bar=false", "hardware.threads_per_process=1")
RAY = ("hardware.launcher=ray",)
# Test-only targets (tests/dist_helpers.py): Ray's workers inherit the driver's PYTHONPATH.
HELPERS_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
FAULTY = ("model._target_=dist_helpers.FaultySeqTransformer", "allowed_targets=[runner.,torch.,dist_helpers.]")
# Ray starts about ten Python processes of its own (GCS, raylet, agents, monitors, the Train controller, actors) before
# a worker trains: the most CPU-bound start-up of the suite. Beside four CPU burners on 2 cores (load average 7.6)
# its controller asked for the workers' resources 2 min 45 s after the driver started and the workers took another
# 57 s to be created, past WAIT_S though nothing was stuck: Ray's waits get twice the suite's deadline.
RAY_WAIT_S = 2 * WAIT_S


def _same_weights(run_dir: Path, reference_dir: Path) -> None:
    trained = load_file(run_dir / "export" / "final.safetensors")
    reference = load_file(reference_dir / "export" / "final.safetensors")
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(trained[name], value), name


def _reference(tmp_path: Path, *overrides: str, env: dict | None = None) -> Path:
    cwd = tmp_path / "multi_cpu"
    cwd.mkdir()
    result = run_cli(*SMALL, "hardware.start_method=fork", *overrides, cwd=cwd, env=env)
    assert result.returncode == 0, result.output
    return result.run_dir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the worker's pid and kills it")
def test_a_killed_ray_worker_is_restarted_exactly(tmp_path):
    """Ray's workers train what multi_cpu trains: one run dir with each rank's log, the final metrics printed, and
    multi_cpu's weights bitwise, although rank 1 is killed (SIGKILL) mid-run: Ray restarts the worker group
    (max_restarts=1 is Ray's max_failures) and the restarted workers continue from the runner's newest checkpoint.
    (One run checks both: a Ray run costs a cluster's start. The docs' Ray example only composes: this test runs it.)"""
    run = (*FAULTY, "trainer.max_steps=8", "checkpoint.every_n_steps=2")
    reference = _reference(tmp_path, *run, env=HELPERS_ENV)
    cwd, marker = tmp_path / "ray", tmp_path / "rank1_hangs"
    cwd.mkdir()
    command = [sys.executable, "-m", "runner", *SMALL, *RAY, *run, "hardware.max_restarts=1", "+model.hang_rank=1",
               "+model.hang_at_forward=6", f"+model.hang_marker={marker}", "hydra.run.dir=run"]
    driver = subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **HELPERS_ENV},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed = PipeReader(driver)
    try:
        deadline = time.monotonic() + RAY_WAIT_S
        while not marker.exists():
            assert driver.poll() is None and time.monotonic() < deadline, \
                f"rank 1 never reached its 6th step; the driver printed:\n{printed.text()}"
            time.sleep(0.2)
        rank1 = (cwd / "run" / "runner_rank1.log").read_text()
        pid = int(re.findall(r"rank 1 of 2 \(local rank 1\), pid (\d+)", rank1)[-1])
        os.kill(pid, signal.SIGKILL)
        driver.wait(timeout=RAY_WAIT_S)
    finally:
        if driver.poll() is None:
            driver.kill()
    output, _ = printed.join()
    assert driver.returncode == 0, output
    assert "launching 2 Ray Train worker(s)" in output
    assert re.search(r"final val/loss=[\d.]+, val/accuracy=[\d.]+ \| run dir", output), output[-3000:]
    for rank in (0, 1):
        log = (cwd / "run" / f"runner_rank{rank}.log").read_text()
        assert f"rank {rank} of 2 (local rank {rank}), pid" in log and "started by ray" in log
    restarted = (cwd / "run" / "runner_rank0.log").read_text()
    assert re.search(r"Ray restarted the workers: continuing from \S*step_0000000[24]", restarted), restarted[-3000:]
    _same_weights(cwd / "run", reference)


def test_ray_needs_several_workers(tmp_path):
    result = run_cli("hardware=cpu", *RAY, "trainer.max_steps=1", cwd=tmp_path)
    assert result.returncode == 1
    assert "hardware.launcher: is ray, which starts several workers; cpu runs one process: use hardware=multi_cpu " \
           "or multi_gpu" in result.stderr, result.stderr
    assert result.run_dirs() == []


def test_an_address_where_no_cluster_answers_is_named_at_once():
    """Ray itself retries such an address for minutes, printing only its own warnings."""
    import ray

    from runner.errors import LaunchError
    from runner.launch.ray_train import _connect

    with pytest.raises(LaunchError, match=r"hardware.ray_address: is 127.0.0.1:9, where no Ray cluster answers "
                                          r"\(.*refused\); give the address `ray start --head` printed"):
        _connect(ray, "127.0.0.1:9", "hardware.ray_address", 2)
    assert not ray.is_initialized()


def test_null_starts_an_instance_of_its_own_unless_ray_address_names_a_cluster(monkeypatch):
    """ray.init() without an address would join the newest cluster `ray start` left on this machine (whose workers
    do not see this run's Python path: the killed-worker test failed so beside another user's cluster); "local" is
    Ray's word for an instance of the run's own. RAY_ADDRESS is how `ray job submit` names its cluster."""
    from runner.launch.ray_train import cluster_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) == ("local", "hardware.ray_address")
    assert cluster_address("auto") == ("auto", "hardware.ray_address")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(None) == ("10.0.0.1:6379", "RAY_ADDRESS")
    assert cluster_address("ray://head:10001") == ("ray://head:10001", "hardware.ray_address")


def test_a_ray_address_where_no_cluster_answers_is_named(tmp_path):
    result = run_cli(*SMALL, *RAY, "trainer.max_steps=1", cwd=tmp_path, env={"RAY_ADDRESS": "127.0.0.1:9"})
    assert result.returncode == 1, result.output
    assert "RAY_ADDRESS: is 127.0.0.1:9, where no Ray cluster answers" in result.stderr, result.stderr
    assert "or null (with RAY_ADDRESS unset) to start one for this run" in result.stderr
