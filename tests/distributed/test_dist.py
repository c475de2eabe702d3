"""runner.distributed.dist and the distributed sharding of batch sources: env reading, threads, the config consistency check
and main-first ordering on 2 real gloo processes, and "each sample once per epoch across ranks"."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from runner.data.batches import TensorBatches
from runner.distributed.dist import DistInfo, config_digest, config_mismatch, threads_per_process

import dist_helpers


def test_dist_info_reads_what_launchers_set(monkeypatch):
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    info = DistInfo.from_env()
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 4, 2)
    assert info.is_distributed and not info.is_main and not info.is_local_main


def test_dist_info_defaults_to_one_process(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert DistInfo.from_env() == DistInfo(0, 0, 1, 1)


def test_threads_split_the_cores_among_workers(monkeypatch):
    """This machine's cores among this machine's workers; an explicit setting wins."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert threads_per_process(DistInfo(0, 0, 8, 4), None) == 4  # 16 cores / 4 workers on this machine
    assert threads_per_process(DistInfo(0, 0, 64, 64), None) == 1
    assert threads_per_process(DistInfo(0, 0, 8, 4), 3) == 3  # an explicit setting wins
    assert threads_per_process(DistInfo(), None) is None  # a lone process: torch's own default stands
    assert threads_per_process(DistInfo(), 2) == 2


def test_threads_follow_the_cpus_slurm_gave(monkeypatch):
    """SLURM_CPUS_PER_TASK bounds a task's threads where every core is visible (no CPU binding on the node)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    for name in ("SLURM_NTASKS", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert threads_per_process(DistInfo(), None) == 4  # sbatch -c 4 python -m runner: one process
    assert threads_per_process(DistInfo(0, 0, 2, 2), None) == 2  # one task starting 2 workers: they share 4
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert threads_per_process(DistInfo(1, 1, 2, 2), None) == 4  # srun -n 2 -c 4: each task is a rank
    assert threads_per_process(DistInfo(1, 1, 2, 2), 1) == 1  # an explicit setting wins


def test_config_digest_ignores_only_the_machine_rank():
    config = {"hardware": {"machine_rank": 0, "num_machines": 2}, "optimizer": {"lr": 0.1}}
    same = {"hardware": {"machine_rank": 1, "num_machines": 2}, "optimizer": {"lr": 0.1}}
    other = {"hardware": {"machine_rank": 0, "num_machines": 2}, "optimizer": {"lr": 0.2}}
    assert config_digest(config) == config_digest(same) != config_digest(other)


def test_a_single_process_is_always_consistent():
    assert config_mismatch({"a": 1}) is None


def _launch_two(fn, *args):
    """2 gloo processes (fork: fast) through torch's elastic launcher, as runner.launch starts them."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="test", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, start_method="fork")
    return elastic_launch(config, fn)(*args)


def test_differing_rank_configs_diff_names_the_key():
    results = _launch_two(dist_helpers.config_mismatch_between_ranks)
    for rank in (0, 1):  # every rank sees the same verdict, so all of them stop
        assert "ranks [1] resolved a different config than rank 0" in results[rank]
        assert "\n-optimizer.lr = 0.1\n+optimizer.lr = 0.2" in results[rank]  # the full key, both values
        assert "seed" not in results[rank] and "machine_rank" not in results[rank]  # only what must agree


def test_local_main_first_runs_rank_0_first(tmp_path):
    results = _launch_two(dist_helpers.record_main_first_order, str(tmp_path / "order.txt"))
    assert (tmp_path / "order.txt").read_text().split() == ["0", "1"]
    assert results == {0: True, 1: True}


def _shards(batches_of, world_size, epoch=0):
    rows = []
    for rank in range(world_size):
        batches = batches_of().shard(rank, world_size)
        batches.set_epoch(epoch)
        rows.append([int(v) for batch in batches for v in batch["id"]])
    return rows


def _ids(num_rows, batch_size, shuffle):
    return lambda: TensorBatches({"id": torch.arange(num_rows)}, batch_size, shuffle=shuffle, seed=7)


def test_train_shards_cover_once_and_reshuffle():
    """Training shards see each sample once per epoch, and reshuffle every epoch."""
    epoch0 = _shards(_ids(64, 8, True), 2, epoch=0)
    epoch1 = _shards(_ids(64, 8, True), 2, epoch=1)
    for shards in (epoch0, epoch1):
        assert len(shards[0]) == len(shards[1]) == 32
        assert sorted(shards[0] + shards[1]) == list(range(64))  # disjoint, and together every sample once
    assert epoch0[0] != epoch1[0]  # a new order each epoch, computed alike on every rank from seed + epoch


def test_train_shards_pad_to_equal_length():
    """Padded when the rows do not divide among the ranks."""
    shards = _shards(_ids(67, 8, True), 4)
    assert [len(shard) for shard in shards] == [17] * 4  # equal: every rank takes the same number of steps
    seen = sorted(sum(shards, []))
    assert set(seen) == set(range(67)) and len(seen) == 68  # one row repeated, as DistributedSampler pads
    assert len({len(_ids(67, 8, True)().shard(rank, 4)) for rank in range(4)}) == 1


def test_evaluation_shards_are_exact_and_unpadded():
    shards = _shards(_ids(63, 8, False), 2)
    assert [len(shard) for shard in shards] == [32, 31]
    assert sorted(shards[0] + shards[1]) == list(range(63))  # no padded duplicates to miscount


def test_torchrun_ranks_share_run_id_with_own_logs(monkeypatch):
    from omegaconf import OmegaConf

    from runner.run.resolvers import register_configs
    from runner.distributed.dist import external_run_id

    register_configs()
    names = OmegaConf.create({"dir": "${runner.launcher_run_id:fallback}", "log": "runner${runner.rank_suffix:}"})
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert (external_run_id(), names.dir, names.log) == (None, "fallback", "runner")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "5551807e")
    monkeypatch.setenv("RANK", "1")
    assert (names.dir, names.log) == ("5551807e", "runner_rank1")
    # torchrun leaves the literal "none" without --rdzv-id on a static rendezvous: the agent (our parent) decides.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert names.dir.startswith("torchrun-") and names.dir.endswith(f"-{os.getppid()}")



EXIT_SCRIPT = '''
import os, sys, time
import torch
import torch.distributed as torch_dist
from runner.distributed import dist

# Every drain announces itself, with whether the group was still there when it happened.
time.sleep = lambda seconds: print(f"{made_by} {ending}: drained {seconds} group={torch_dist.is_initialized()}",
                                   flush=True)
import gc; gc.freeze()  # each case's exit skips collecting torch's million objects (runner/launch/shutdown.py)
for made_by, ending in [case.split(",") for case in sys.argv[1:]]:
    if os.fork() == 0:  # each case in a process of its own, which exits as a script does (atexit, finalization)
        torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
        dist.leave_at_exit(own=made_by == "own")
        dist.leave_at_exit(own=True)  # registered once: a second call (a worker's Accelerator's) adds nothing
        torch_dist.all_reduce(torch.ones(1))
        if ending == "script-destroys":
            torch_dist.destroy_process_group()  # as Accelerate's test_sync.py does, then exits
        elif ending == "runner-destroys":
            dist.destroy_process_group()
        print(f"{made_by} {ending}: exiting", flush=True)
        sys.exit(0)
    assert os.wait()[1] == 0
'''


def test_a_gloo_group_is_drained_before_the_interpreter_exits(tmp_path):
    """gloo's threads drop their last work's tensors just after the waiter returns; when that happens during
    finalization the process aborts (SIGABRT, "terminate called without an active exception"). Whoever destroyed
    the group, the process sleeps GLOO_DRAIN_S once before it exits; a group the script keeps is not destroyed."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    cases = ["own,left", "own,script-destroys", "script,script-destroys", "script,left", "own,runner-destroys"]
    done = subprocess.run([sys.executable, str(script), *cases], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "own left: exiting", "own left: drained 0.2 group=False",  # destroyed at exit, then drained
        "own script-destroys: exiting", "own script-destroys: drained 0.2 group=False",
        "script script-destroys: exiting", "script script-destroys: drained 0.2 group=False",
        "script left: exiting", "script left: drained 0.2 group=True",  # kept: drained, not destroyed
        "own runner-destroys: drained 0.2 group=False", "own runner-destroys: exiting",  # once, not again at exit
    ], done.stdout
