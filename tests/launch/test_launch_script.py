"""A user's own script on N processes: `python -m runner.launch`, torchrun and plain python run the same
hand-written loop (runner.Accelerator joins the group itself) to the same weights; srun's tasks become the ranks
of one run; a restarted group continues from its newest checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, communicate_all, free_port, read_jsonl, run_cli, run_dirs_under, wait_for
from runner.launch.agent import _alive
from runner.launch.launcher import script_failure, split_command
from tolerances import reordered_sum_bound

SCRIPT = ROOT / "tests" / "scripts" / "handwritten_train.py"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plain") / "weights.pt"
    done = _run(str(SCRIPT), "--batch-size", "32", "--out", str(out), cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return torch.load(out)


def _assert_same_training(result: dict, reference: dict) -> None:
    """2 processes x 16 rows against 1 x 32, SGD: each step's gradient sums the same 32 rows in another order, so
    weights and losses differ by at most that rounding (tests/tolerances.py)."""
    assert result["processes"] == 2 and reference["processes"] == 1
    assert len(result["losses"]) == len(reference["losses"])
    for several, single in zip(result["losses"], reference["losses"]):
        assert abs(several - single) <= reordered_sum_bound(32, abs(single)), (result["losses"], reference["losses"])
    moved = max(float((value - reference["initial"][name]).abs().max()) for name, value in reference["weights"].items())
    bound = reordered_sum_bound(32, moved)
    for name, value in reference["weights"].items():
        assert float((result["weights"][name] - value).abs().max()) <= bound, (name, bound)


def _rank_output(folder: Path) -> str:
    """Every rank's stderr.log under `folder`: what a failure message needs, since pytest removes old tmp dirs (a
    rank ended by SIGABRT once under tests/stress.sh, its "terminate called" line all that reached the console)."""
    return "".join(f"\n--- {path.relative_to(folder)}:\n{path.read_text(errors='replace')[-4000:]}"
                   for path in sorted(folder.rglob("stderr.log")))


def test_launch_runs_the_readme_loop_on_two_processes(tmp_path, one_process):
    """Like one process with the whole batch (the same weights); each rank's output is kept under outputs/launch."""
    done = _run("-m", "runner.launch", "hardware=multi_cpu", str(SCRIPT), "--batch-size", "16", "--out", "w.pt",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr + _rank_output(tmp_path)
    assert "runner: 2 process(es) of" in done.stderr
    _assert_same_training(torch.load(tmp_path / "w.pt"), one_process)
    assert sorted(path.parent.name for path in (tmp_path / "outputs" / "launch").rglob("stdout.log")) == ["0", "1"]


def test_torchrun_runs_the_same_loop_unchanged(tmp_path, one_process):
    done = _run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
                "--batch-size", "16", "--out", "w.pt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    _assert_same_training(torch.load(tmp_path / "w.pt"), one_process)


def test_a_failing_script_gives_one_message(tmp_path):
    """The message names the rank that failed first, its exit code, and where the scripts' output is."""
    done = _run("-m", "runner.launch", "hardware=multi_cpu", str(SCRIPT), "--batch-size", "16", "--out", "w.pt",
                "--fail-rank", "1", cwd=tmp_path)
    assert done.returncode == 1
    # The scripts' own output (rank 0's traceback after losing its peer) is theirs to show; the runner adds one
    # paragraph at the end.
    summary = done.stderr[done.stderr.rindex("runner: error:"):]
    # Rank 0 then either fails on losing its peer (exit 1) or is ended by the launcher (SIGTERM): a race. Rank 1,
    # which failed first, is named first either way.
    assert re.match(r"runner: error: rank 1 failed first: it exited with code 3; then rank 0 (exited with code 1|"
                    r"was killed by signal SIGTERM)", summary), summary
    assert re.search(r"their output: outputs/launch/\S+/ranks/[^/]+/attempt_0/<local rank>/stderr.log",
                     summary), summary
    assert (tmp_path / summary.split("their output: ")[1].split("<local rank>")[0] / "1" / "stderr.log").is_file()


def test_a_missing_script_is_named_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    from runner.launch.launcher import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(["hardware=multi_cpu", "nothere.py", "--lr", "1"])
    err = capsys.readouterr().err
    assert ended.value.code == 1 and f"runner: error: no script 'nothere.py' (looked in {tmp_path})" in err
    assert "[rank" not in err and not (tmp_path / "outputs").exists()


def _failure(pid: int, exitcode: int, timestamp: int = 100):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure.__new__(ProcessFailure)  # no error file to read: only what the message uses
    failure.local_rank, failure.pid, failure.exitcode, failure.timestamp = 0, pid, exitcode, timestamp
    return failure


def test_the_rank_that_exited_first_is_named_first():
    """Whatever its rank number."""
    # Rank 1 failed (exit 3) 40 ms before rank 0 lost its peer (exit 1): the launcher's timestamps tie (seconds).
    failures = {0: _failure(pid=10, exitcode=1), 1: _failure(pid=11, exitcode=3)}
    assert script_failure(failures, {10: 5.04, 11: 5.0}) == (
        "rank 1 failed first: it exited with code 3; then rank 0 exited with code 1")
    # A rank the launcher ended (SIGTERM) is not the first failure: with exit times unknown, nor when the other
    # rank's exit was timed late or not at all (under load the thread timing it can wake after the SIGTERM).
    failures = {0: _failure(pid=10, exitcode=-15), 1: _failure(pid=11, exitcode=3)}
    for exited in ({}, {10: 5.0}, {10: 5.0, 11: 5.2}):
        assert script_failure(failures, exited) == (
            "rank 1 failed first: it exited with code 3; then rank 0 was killed by signal SIGTERM"), exited
    # A rank killed by the kernel (SIGKILL) before anyone else exited is the root cause, SIGKILL or not.
    failures = {0: _failure(pid=10, exitcode=1), 1: _failure(pid=11, exitcode=-9)}
    assert script_failure(failures, {10: 2.5, 11: 2.0}).startswith("rank 1 failed first: it was killed by signal "
                                                                    "SIGKILL")


def test_a_rank_that_lost_its_peer_is_not_named_first():
    """Rank 1 raised; rank 0's collective then broke ("Connection reset by peer") and it exited first, while rank 1
    was still shutting down: the end of each rank's stderr tells which only lost its peer."""
    failures = {0: _failure(pid=10, exitcode=1), 1: _failure(pid=11, exitcode=1)}
    lost = ("[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset "
            "by peer")
    raised = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"fail.py\", line 4, in <module>\n"
              "[rank1]:     raise ValueError(\"boom on rank 1\")\n[rank1]: ValueError: boom on rank 1\n")
    assert script_failure(failures, {10: 2.0, 11: 2.3}, {0: lost, 1: raised}) == (
        "rank 1 failed first: it raised ValueError: boom on rank 1; then rank 0 exited with code 1 (it lost its "
        "connection to another rank)")
    # The launcher ended rank 1 (SIGTERM) while it was still shutting down after raising: what it raised is named.
    failures[1] = _failure(pid=11, exitcode=-15)
    assert script_failure(failures, {10: 2.0, 11: 2.3}, {0: lost, 1: raised}).startswith(
        "rank 1 failed first: it raised ValueError: boom on rank 1 (then was killed by signal SIGTERM); then rank 0")
    assert script_failure(failures, {10: 2.0, 11: 2.3}, {0: lost, 1: "no traceback here"}).startswith(
        "rank 1 failed first: it was killed by signal SIGTERM; then rank 0")


def test_a_launcher_the_script_cannot_have_is_refused(tmp_path, capsys, monkeypatch):
    """hardware.launcher=ray was ignored: the script ran under torch's launcher, with no word."""
    from runner.launch.launcher import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('ran')\n")
    with pytest.raises(SystemExit) as ended:
        main(["hardware=multi_cpu", "hardware.launcher=ray", "train.py"])
    err = capsys.readouterr().err
    assert ended.value.code == 1 and "runner: error: hardware.launcher: is ray, which starts the runner's own" in err
    assert not (tmp_path / "outputs").exists()


def test_the_script_arguments_pass_on_untouched():
    assert split_command(["hardware=multi_cpu", "gpu_ids=[0,1]", "train.py", "--lr=3", "x=1"]) == (
        ["hardware=multi_cpu", "gpu_ids=[0,1]"], ["train.py", "--lr=3", "x=1"])
    assert split_command(["-m", "pkg.train", "--a"]) == ([], ["-m", "pkg.train", "--a"])


def _srun(tasks: int, *overrides: str, cwd: Path) -> list[subprocess.CompletedProcess]:
    """What `srun -n TASKS python -m runner ...` does on one node, with SLURM's variables set by hand."""
    port, procs = free_port(), []
    for task in range(tasks):
        slurm = {"SLURM_PROCID": str(task), "SLURM_NTASKS": str(tasks), "SLURM_LOCALID": str(task),
                 "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": str(tasks), "SLURM_JOB_ID": "4242",
                 "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "runner", *overrides], cwd=cwd, env={**ENV, **slurm},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [subprocess.CompletedProcess(p.args, *finished) for p, finished in zip(procs, communicate_all(procs))]


SMALL = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=32", "trainer.max_steps=2",
         "trainer.log_every_steps=1", "trainer.progress_bar=false")


def test_srun_tasks_are_the_ranks_of_one_run(tmp_path):
    """Both tasks agree on one run dir."""
    results = _srun(2, "hardware=multi_cpu", *SMALL, cwd=tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs_under(tmp_path)
    assert run_dir.name == "slurm-4242.0"  # both tasks agreed on it
    assert "rank 1 of 2" in (run_dir / "runner_rank1.log").read_text()
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in row] == [1, 2]


def test_extra_srun_tasks_are_refused_not_run_twice(tmp_path):
    """More srun tasks than the hardware asks for (2 for hardware=cpu): refused, and no run dir."""
    results = _srun(2, *SMALL, cwd=tmp_path)  # hardware=cpu: one process
    for result in results:
        assert result.returncode == 1
        assert "hardware: cpu runs one process, but the launcher (torchrun or srun) started 2" in result.stderr
    assert run_dirs_under(tmp_path) == []


def test_a_restarted_rank_ends_as_if_it_never_crashed(tmp_path):
    """A rank that crashes once is restarted (max_restarts=1); the run ends with the uninterrupted run's weights."""
    from safetensors.torch import load_file

    run = ("hardware=multi_cpu", "hardware.start_method=fork", *SMALL, "trainer.max_steps=8",
           "checkpoint.every_n_steps=2", "model._target_=dist_helpers.FaultySeqTransformer",
           "allowed_targets=[runner.,torch.,dist_helpers.]")
    helpers = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "uninterrupted").mkdir()
    reference = run_cli(*run, cwd=tmp_path / "uninterrupted", env=helpers)
    assert reference.returncode == 0, reference.output
    (tmp_path / "crashing").mkdir()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    unused = temporary.stat().st_mtime_ns
    # (torch makes a cache folder of its own under TMPDIR the first time a model calls F.embedding: not there.)
    crashed = run_cli(*run, "+model.fail_rank=1", "+model.fail_at_forward=6", "+model.fail_attempt=0",
                      "hardware.max_restarts=1", cwd=tmp_path / "crashing",
                      env={**helpers, "TMPDIR": str(temporary), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")})
    assert crashed.returncode == 0, crashed.output
    # The ranks' error files of both attempts were written under TMPDIR (its mtime moved) and are gone with the run.
    assert list(temporary.iterdir()) == [] and temporary.stat().st_mtime_ns != unused
    assert "restart 1: continuing from" in crashed.output
    # The console says why, before the restarted group starts: the failed rank, its error's last line, from where.
    # Where from: step 4's checkpoint, or step 2's when step 4's was still sealing in rank 0's background thread
    # as rank 1 failed (a loaded machine): the newest sealed one, the one the restarted workers continue from.
    said = re.search(r"runner: rank 1 failed: ValueError: injected failure at training forward 6; "
                     r"restart 1 of 1 from step (\d+)\n", crashed.stderr)
    assert said and said.group(1) in ("2", "4"), crashed.stderr[-3000:]
    continued = rf"restart 1: continuing from \S*step_{int(said.group(1)):08d}"
    assert re.search(continued, crashed.output), crashed.output[-3000:]
    for name, value in load_file(reference.run_dir() / "export" / "final.safetensors").items():
        assert torch.equal(load_file(crashed.run_dir() / "export" / "final.safetensors")[name], value), name


def test_a_torchrun_restart_resumes_not_refuses(tmp_path, monkeypatch):
    """Restarted by torchrun, a run resumes from its own checkpoints instead of refusing them (no resume= given)."""
    from runner.commands.cli import main

    monkeypatch.chdir(tmp_path)
    main([*SMALL, "trainer.max_steps=2", "hydra.run.dir=run"])
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # what torchrun --max-restarts sets on a restart
    main([*SMALL, "trainer.max_steps=4", "hydra.run.dir=run"])  # without resume=: it would be refused
    assert [row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/loss" in row] == [1, 2, 3, 4]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
def test_kill_9_of_the_launcher_leaves_no_rank_alive(tmp_path):
    """No rank of the launched script outlives it."""
    import signal
    import time

    launcher = subprocess.Popen([sys.executable, "-m", "runner.launch", "hardware=multi_cpu",
                                 str(ROOT / "tests" / "scripts" / "sleeper.py"), str(tmp_path)],
                                cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
        wait_for(lambda: all(path.exists() for path in pid_files), "both ranks of the script to write their pid")
        ranks = [int(path.read_text()) for path in pid_files]
        assert all(_alive(pid) for pid in ranks)
        launcher.kill()
        launcher.wait(timeout=60)
        killed = time.monotonic()
        while any(_alive(pid) for pid in ranks) and time.monotonic() - killed < 5.0:
            time.sleep(0.05)
        assert not [pid for pid in ranks if _alive(pid)], "ranks still alive 5 s after kill -9 of the launcher"
    finally:
        launcher.kill()
        for path in tmp_path.glob("rank*.pid"):  # never leave a sleeper behind, even when the test fails
            try:
                os.kill(int(path.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_rank_exec_refuses_when_the_launcher_is_gone(tmp_path):
    """It does not start the rank at all."""
    done = _run("-m", "runner.launch.rank_exec", "1", "-c", "print('started')", cwd=tmp_path)  # pid 1 is not our parent
    assert done.returncode == 1
    assert "started" not in done.stdout
    assert "the launcher (pid 1) is gone; not starting -c" in done.stderr
