"""End-to-end, several processes: `python -m runner hardware=multi_cpu ...` (and torchrun, and two "machines")
as subprocesses on 2 gloo CPU processes, asserting on PIDs, run dirs, logs, exit codes and trained weights.

Most tests use hardware.start_method=fork (~0.3 s per launch instead of seconds); the equivalence test keeps the
default, spawn.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from conftest import (
    ROOT, WAIT_S, communicate_all, free_port, read_jsonl, read_scalars, run_cli, run_dirs_under, wait_for,
)
from tolerances import reordered_sum_bound

SMALL = ("data.num_validation=63", "trainer.progress_bar=false")  # 63: the ranks' eval shards differ in size
FORK = ("hardware=multi_cpu", "hardware.start_method=fork")
# Test-only targets (tests/dist_helpers.py): the workers import them, so tests/ goes on their PYTHONPATH.
HELPERS_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
FAULTY = ("model._target_=dist_helpers.FaultySeqTransformer", "allowed_targets=[runner.,torch.,dist_helpers.]")


def _rank_log(run_dir: Path, rank: int) -> str:
    return (run_dir / f"runner_rank{rank}.log").read_text()


def _worker_pid(run_dir: Path, rank: int) -> int:
    return int(re.search(rf"rank {rank} of 2 \(local rank \d\), pid (\d+)", _rank_log(run_dir, rank)).group(1))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_only_rank_0_of_two_workers_writes_shared(cli):
    """Two distinct worker processes really run; only rank 0 writes the shared files and the console."""
    # 288 rows: a dataset no other test generated, so its generation shows up in the output.
    result = cli(*FORK, "data.num_validation=63", "data.num_train=288", "trainer.batch_size=48",
                 "trainer.max_steps=4", "trainer.log_every_steps=2", "trainer.progress_every_s=0")  # progress shown
    assert result.returncode == 0, result.output
    run_dir = result.run_dir()
    # One progress, rank 0's, written straight to the console (the agent's tee would prefix each line, and each
    # redraw of a terminal's bar, with [rank0]:); a pipe gets its lines, one a step here. The other rank's log lines
    # are in its own file only.
    progress = [line for line in result.output.splitlines() if "train: step" in line]
    assert [line.split(" - ", 1)[1].split(",")[0] for line in progress] == [f"train: step {step}/4 ({25 * step}%)"
                                                                            for step in (1, 2, 3, 4)]
    assert "[rank" not in result.output
    assert "rank 0 of 2" in result.output and "rank 1 of 2" not in result.output
    assert "rank 1 of 2" in _rank_log(run_dir, 1)
    parent_pid = int(re.search(r"from pid (\d+)", (run_dir / "runner.log").read_text()).group(1))
    pids = {_worker_pid(run_dir, rank) for rank in (0, 1)}
    assert len(pids | {parent_pid}) == 3  # two distinct workers, neither of them the launching process

    cores = len(os.sched_getaffinity(0))
    for rank in (0, 1):
        assert f"{max(1, cores // 2)} thread(s)" in _rank_log(run_dir, rank)  # cores shared, not oversubscribed
        assert ("batch: 48 global per optimizer step = 24 per device x 2 process(es) x 1 accumulation step(s)"
                in _rank_log(run_dir, rank))
    # Shared artifacts come from rank 0 alone: each logged step once, one checkpoint.
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in row] == [2, 4]
    assert [step for step, _ in read_scalars(run_dir, "train/loss")] == [2, 4]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000004"


def test_a_table_is_cached_once_and_ranks_reuse_it(cli, tmp_path):
    """The launcher reads the table into the datasets cache once; no rank builds it again."""
    # 97 rows: a table no other test read, so its conversion into the datasets cache shows up in the output.
    rows = "".join(f"{i % 7}.5,{(i * 3) % 11}.25,{'ab'[i % 2]}\n" for i in range(97))
    (tmp_path / "table.csv").write_text("width,depth,kind\n" + rows)
    result = cli(*FORK, *SMALL[1:], "recipe=tabular_csv", "data.train=table.csv", "data.label_column=kind",
                 "trainer.max_steps=2", "trainer.batch_size=16", "checkpoint.enabled=false")
    assert result.returncode == 0, result.output
    # The launcher says it built the data (datasets' own "Generating train split" bar, once the evidence here, is
    # off the console now); no rank builds it again: their output has no datasets bar either.
    built = [line for line in result.output.splitlines() if "the data built here once" in line]
    assert len(built) == 1 and not built[0].startswith("[rank"), result.output
    for stderr in (result.run_dir() / "ranks").rglob("stderr.log"):
        assert "Generating" not in stderr.read_text()


def test_a_failing_rank_is_named_and_stops_the_group(cli):
    """The message names the rank and its log; no process of the group is left behind."""
    result = cli(*FORK, *SMALL, *FAULTY, "data.num_train=256", "trainer.batch_size=32", "+model.fail_rank=1",
                 "+model.fail_at_forward=3", "hardware.shutdown_timeout_s=5", env=HELPERS_ENV,
                 timeout=WAIT_S)  # ends well before rank 0's collective timeout (hardware.timeout_s, 600 s)
    assert result.returncode == 1, result.output
    assert "runner: error: rank 1 failed after 2 optimizer step(s): ValueError: injected failure at training " \
           "forward 3" in result.stderr, result.stderr[-3000:]
    tail = result.stderr.split("end of its traceback:")[1]
    assert "dist_helpers.py" in tail and "ValueError: injected failure" in tail
    run_dir = result.run_dir()
    assert f"its full log: {run_dir / 'runner_rank1.log'}" in result.stderr
    assert "Traceback" in _rank_log(run_dir, 1)  # the whole traceback is in the rank's own log
    assert not any(_alive(_worker_pid(run_dir, rank)) for rank in (0, 1))


def test_killing_the_launcher_takes_its_workers_down(tmp_path):
    command = [sys.executable, "-m", "runner", *FORK, *SMALL, *FAULTY, "data.num_train=256",
               "trainer.batch_size=32", "+model.sleep_s=0.5"]
    launcher = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, **HELPERS_ENV},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = _wait_for_worker_pids(tmp_path)
        assert all(_alive(pid) for pid in pids)
    finally:
        launcher.kill()  # SIGKILL: the launcher gets no chance to stop its workers itself
        launcher.wait()
    wait_for(lambda: not any(_alive(pid) for pid in pids), f"the workers {pids} to end with their launcher "
             "(orphaned workers survived it)")


def _wait_for_worker_pids(cwd: Path) -> list[int]:
    def started() -> list[int]:
        texts = [log.read_text() for log in sorted((cwd / "outputs").rglob("runner_rank*.log"))]
        if len(texts) == 2 and all("global per optimizer step" in text for text in texts):
            return [int(re.search(r"pid (\d+)", text).group(1)) for text in texts]
        return []

    return wait_for(started, "both workers to start (runner_rank*.log saying 'global per optimizer step')", poll_s=0.2)


def test_two_runs_at_once_do_not_collide(tmp_path):
    command = [sys.executable, "-m", "runner", *FORK, *SMALL, "data.num_train=256", "trainer.batch_size=32",
               "trainer.max_steps=2"]
    runs = []
    for index in (0, 1):
        (tmp_path / f"run{index}").mkdir()
        runs.append(subprocess.Popen(command, cwd=tmp_path / f"run{index}", stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True))
    for code, output, _ in communicate_all(runs):
        assert code == 0, output  # each group picked its own free rendezvous port
        assert "final val/loss=" in output


def test_a_sweep_runs_each_job_in_its_own_group(cli):
    """Each job gets a process group of fresh workers."""
    result = cli("-m", *FORK, *SMALL, "data.num_train=256", "trainer.batch_size=32", "trainer.max_steps=2",
                 "optimizer.lr=0.1,0.01")
    assert result.returncode == 0, result.output
    jobs = result.run_dirs()
    assert [job.name for job in jobs] == ["0", "1"] and jobs[0].parent == jobs[1].parent
    assert [yaml.safe_load((job / "config.yaml").read_text())["optimizer"]["lr"] for job in jobs] == [0.1, 0.01]
    pids = {_worker_pid(job, rank) for job in jobs for rank in (0, 1)}
    assert len(pids) == 4  # fresh workers per job
    for job in jobs:
        assert [step for step, _ in read_scalars(job, "val/accuracy")] == [2]


@pytest.fixture(scope="module")
def one_process_reference(tmp_path_factory):
    """The default recipe on small data, one process: what every other process count must reproduce."""
    cwd = tmp_path_factory.mktemp("one_process")
    result = run_cli("hardware=cpu", *INVARIANT, cwd=cwd)
    assert result.returncode == 0, result.output
    return result


# A global batch of 64 (trainer.batch_size is global): 64 x 1, 32 x 2 or 16 x 4 per device; 63 validation rows
# split unevenly across the ranks. SGD with momentum: its weight change is linear in the gradients, so the process
# count's summation order leaves differences within tests/tolerances.py's bound (AdamW's normalisation would not).
INVARIANT = ("data.num_train=256", "trainer.max_steps=4", "trainer.log_every_steps=1", "trainer.batch_size=64",
             "optimizer=sgd", *SMALL)
TOKENS_PER_STEP = 64 * 12  # the terms each step's gradient sums: 64 sequences of 12 digits (conf/data/reverse_digits)


@pytest.mark.parametrize("processes, start", [(2, "spawn"), (4, "fork")])
def test_any_process_count_trains_the_same_weights(cli, tmp_path, one_process_reference, processes, start):
    """The same command, on 2 (spawn) or 4 (fork) processes, ends with one process's weights."""
    result = cli("hardware=multi_cpu", f"hardware.num_processes={processes}", f"hardware.start_method={start}",
                 *INVARIANT)
    assert result.returncode == 0, result.output
    assert f"({start} start)" in result.output
    per_device = 64 // processes
    assert (f"batch: 64 global per optimizer step = {per_device} per device x {processes} process(es) x 1 "
            "accumulation step(s)") in (result.run_dir() / "runner_rank0.log").read_text()
    weights = [load_file(run.run_dir() / "checkpoints" / "step_00000004" / "model.safetensors")
               for run in (one_process_reference, result)]
    assert weights[0].keys() == weights[1].keys()
    # Scale: each tensor's largest weight, which bounds what 4 small SGD steps moved it (biases start at 0, where
    # the two coincide) and the rounding of the weight itself.
    for name in weights[0]:
        bound = reordered_sum_bound(TOKENS_PER_STEP, float(weights[0][name].abs().max()))
        difference = float((weights[1][name] - weights[0][name]).abs().max())
        assert difference <= bound, (name, difference, bound)
    losses = [[value for _, value in read_scalars(run.run_dir(), "train/loss")] for run in (one_process_reference, result)]
    assert len(losses[0]) == 4
    for several, single in zip(losses[1], losses[0]):  # each a mean over the step's tokens, reordered
        assert abs(several - single) <= reordered_sum_bound(TOKENS_PER_STEP, abs(single)), losses
    # Evaluation over 63 rows split unevenly across the ranks: the same numbers as one process.
    for tag in ("val/loss", "val/accuracy"):
        (_, single), = read_scalars(one_process_reference.run_dir(), tag)
        (_, several), = read_scalars(result.run_dir(), tag)
        assert abs(several - single) <= reordered_sum_bound(63 * 12, abs(single)), (tag, several, single)


def test_an_unshareable_global_batch_is_refused(cli):
    """A global batch the processes cannot share evenly (30 over 4) is refused."""
    result = cli("hardware=multi_cpu", "hardware.num_processes=4", "trainer.batch_size=30", *SMALL)
    assert result.returncode == 1
    assert ("trainer.batch_size: is 30, the global batch, which 4 processes cannot share evenly; use a multiple of "
            "4 (e.g. 32)") in result.stderr


def _torchrun(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "runner", *arguments]
    return subprocess.run(command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                          text=True, timeout=600)


def test_torchrun_ranks_share_one_run_dir(tmp_path):
    """torchrun starts the ranks (no respawn: its processes are the workers)."""
    result = _torchrun("hardware=multi_cpu", *SMALL, "data.num_train=256", "trainer.batch_size=32",
                       "trainer.max_steps=2", "trainer.log_every_steps=1", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = run_dirs_under(tmp_path)
    assert not (run_dir / "ranks").exists()  # no respawn: torchrun's processes are the workers
    assert len({_worker_pid(run_dir, 0), _worker_pid(run_dir, 1)}) == 2
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in row] == [1, 2]
    # Each rank logs to its own file; the console gets rank 0's lines only, as under the runner's own launcher.
    assert (result.stdout + result.stderr).count("run dir: ") == 1, result.stdout + result.stderr
    assert (run_dir / "runner_rank1.log").read_text().count("run dir: ") == 1


def test_torchrun_sweep_keeps_one_group_across_jobs(tmp_path):
    result = _torchrun("-m", "hardware=multi_cpu", *SMALL, "data.num_train=256", "trainer.batch_size=32",
                       "trainer.max_steps=1", "optimizer.lr=0.1,0.01", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = run_dirs_under(tmp_path)
    assert [job.name for job in jobs] == ["0", "1"]  # both ranks agreed on one sweep dir
    for job in jobs:
        assert (job / "runner_rank0.log").is_file() and (job / "runner_rank1.log").is_file()
        assert [step for step, _ in read_scalars(job, "val/accuracy")] == [1]


def _two_machines(tmp_path: Path, *extra_for_machine_1: str) -> list[tuple[int, str, Path]]:
    """Two launcher processes on this host acting as two machines of one process each, each in its own cwd."""
    port, launchers = free_port(), []
    for machine in (0, 1):
        cwd = tmp_path / f"machine{machine}"
        cwd.mkdir()
        command = [sys.executable, "-m", "runner", *FORK, "hardware.num_processes=1", "hardware.num_machines=2",
                   f"hardware.machine_rank={machine}", "hardware.main_process_ip=127.0.0.1",
                   f"hardware.main_process_port={port}", "hardware.timeout_s=120", *SMALL, "data.num_train=256",
                   "trainer.batch_size=32", "trainer.max_steps=2", *(extra_for_machine_1 if machine else ())]
        launchers.append((subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cwd))
    finished = communicate_all([launcher for launcher, _ in launchers])
    return [(code, output, cwd) for (code, output, _), (_, cwd) in zip(finished, launchers)]


def _only_run_dir(cwd: Path) -> Path:
    """The one run dir under cwd (machine 1's holds Hydra's record but no config.yaml: only machine 0 writes it)."""
    (hydra_record,) = (cwd / "outputs").rglob(".hydra")
    return hydra_record.parent


def test_two_machines_meet_at_machine_0s_rendezvous(tmp_path):
    (code0, out0, cwd0), (code1, out1, cwd1) = _two_machines(tmp_path)
    assert code0 == 0, out0
    assert code1 == 0, out1
    main, other = _only_run_dir(cwd0), _only_run_dir(cwd1)
    assert "rank 0 of 2" in _rank_log(main, 0) and "rank 1 of 2" in _rank_log(other, 1)  # ranks in machine order
    assert (main / "metrics.jsonl").is_file() and (main / "checkpoints").is_dir()
    assert not (other / "metrics.jsonl").exists() and not (other / "checkpoints").exists()
    assert (main / "config.yaml").is_file() and not (other / "config.yaml").exists()  # run-level files: machine 0
    finals = [re.search(r"final (.*) \| run dir", out).group(1) for out in (out0, out1)]
    assert finals[0] == finals[1]  # both machines return the same gathered metrics


def test_machines_with_different_configs_refuse(tmp_path):
    """Each machine refuses to train and shows the diff against rank 0's config."""
    results = _two_machines(tmp_path, "optimizer.lr=0.5")
    for code, output, _ in results:
        assert code == 1, output
        assert "resolved a different config than rank 0" in output
        assert "\n-optimizer.lr = 0.003\n+optimizer.lr = 0.5\n" in output
        assert "every machine must run the same command" in output


def test_unused_parameters_need_find_unused_to_train(cli, tmp_path):
    """A model with an unused parameter fails naming parallel.find_unused_parameters, then trains with it set."""
    unused = ("model._target_=dist_helpers.WithAnUnusedLayer", "allowed_targets=[runner.,torch.,dist_helpers.]",
              *FORK, *SMALL, "data.num_train=256", "trainer.max_steps=3")
    (tmp_path / "plain").mkdir()
    (tmp_path / "told").mkdir()
    plain = cli(*unused, env=HELPERS_ENV, cwd=tmp_path / "plain")
    assert plain.returncode == 1
    assert "parallel.find_unused_parameters: some parameters of the model got no gradient" in plain.stderr
    assert "set parallel.find_unused_parameters=true" in plain.stderr and "Traceback" not in plain.output
    told = cli(*unused, "parallel.find_unused_parameters=true", env=HELPERS_ENV, cwd=tmp_path / "told")
    assert told.returncode == 0, told.output
    assert [step for step, _ in read_scalars(told.run_dir(), "val/accuracy")] == [3]


def test_a_failed_start_keeps_only_the_named_log(cli):
    """A rank that fails before training: its message names its log, the one file left behind."""
    result = cli(*FORK, *SMALL, "model._target_=dist_helpers.FailsToBuild", "+model.build_fail_rank=1",
                 "allowed_targets=[runner.,torch.,dist_helpers.]", "hardware.shutdown_timeout_s=5", env=HELPERS_ENV)
    assert result.returncode == 1, result.output
    assert "ValueError: injected failure while building the model (rank 1, before the first optimizer step)" \
        in result.stderr, result.stderr[-3000:]
    rank_log = Path(re.search(r"its full log: (\S+)", result.stderr).group(1))
    assert rank_log.name == "runner_rank1.log"
    assert "ValueError: injected failure while building the model" in rank_log.read_text()
    # Everything else this failed start created is gone: only the log the message names is left.
    assert [path.name for path in rank_log.parent.iterdir()] == ["runner_rank1.log"]
    assert result.run_dirs() == []
