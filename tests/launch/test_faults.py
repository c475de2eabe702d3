"""Faults, end to end, as a user meets them: a full disk, stop signals and Ctrl-C, a rank that fails or hangs, a
launcher killed while a rank hangs. Each ends with a true exit code, one message and nothing half-written.

Several processes run on 2 gloo CPU workers started with fork (fast); the full disk is a size-limited tmpfs,
which root can mount on these machines.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, WAIT_S, free_port, read_jsonl, run_cli, wait_for
from runner.checkpoint import complete_checkpoints, damage, read_pointer

FORK = ("hardware=multi_cpu", "hardware.start_method=fork")
SMALL = ("data.num_train=512", "data.num_validation=64", "trainer.batch_size=32", "trainer.progress_bar=false")
HELPERS_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
FAULTY = ("model._target_=dist_helpers.FaultySeqTransformer", "allowed_targets=[runner.,torch.,dist_helpers.]")
# A long, slow run (0.1 s a forward pass): there is time to signal it while it trains.
SLOW = (*SMALL, *FAULTY, "data.num_train=4096", "+model.sleep_s=0.1", "trainer.log_every_steps=1")


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MB file system: room for the run's first checkpoint, not its second."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()}); tests/checkpoint/test_checkpoint.py injects "
                    "ENOSPC instead")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.parametrize("hardware", [(), FORK], ids=["1 process", "2 processes"])
def test_a_full_disk_keeps_the_last_checkpoint(tmp_path, tmpfs, hardware):
    """A full disk stops the run with one message, keeps the last complete checkpoint, and resume=auto continues."""
    (tmpfs / "filler").write_bytes(b"\0" * 400 * 1024)  # the user's other files on that disk
    run_dir = tmpfs / "run"
    steps = (*SMALL, "checkpoint.every_n_steps=4", "trainer.max_steps=12", f"hydra.run.dir={run_dir}", *hardware)
    full = run_cli(*steps, cwd=tmp_path)
    assert full.returncode == 1, full.output
    assert "Traceback" not in full.output
    message = [line for line in full.stderr.splitlines() if line.startswith("runner: error:")]
    assert len(message) == 1 and message[0].startswith(f"runner: error: no space left on the disk holding {run_dir / 'checkpoints'}"
                                 "/step_00000008 while writing checkpoint step 8"), full.stderr
    assert "the last complete checkpoint is step 4" in full.stderr and "resume=auto" in full.stderr
    assert not [path for path in run_dir.rglob("*") if path.name.startswith(".partial-")]
    assert read_pointer(run_dir / "checkpoints") == "step_00000004"
    assert damage(run_dir / "checkpoints" / "step_00000004") is None

    subprocess.run(["mount", "-o", "remount,size=16m", str(tmpfs)], check=True)  # space freed
    resumed = run_cli(*steps, "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.output and "step 4" in resumed.output
    assert [step for step in (m["step"] for _, m in complete_checkpoints(run_dir / "checkpoints"))] == [4, 8, 12]
    train_rows = [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in row]
    assert train_rows == [12]  # the recipe logs every 25 steps and at the end: once, though two invocations ran


def test_a_disk_full_before_training_is_one_paragraph(tmp_path, tmpfs):
    """A disk with no room for Hydra's .hydra/ record (4 KB free: one tmpfs page, and the record takes three files)
    ends with one message naming the disk, not a traceback, and leaves the run dir unlocked."""
    (tmpfs / "filler").write_bytes(b"\0" * (2048 - 4) * 1024)
    run_dir = tmpfs / "run"
    result = run_cli(*SMALL, "trainer.max_steps=4", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output
    message = [line for line in result.stderr.splitlines() if line.startswith("runner: error:")]
    assert message == [f"runner: error: no space left on the disk holding {run_dir / '.hydra'} while writing Hydra's "
                       "record of the run (.hydra/ and runner.log)"], result.stderr
    assert not list(tmpfs.rglob(".runner.lock.holder"))  # the lock released (its file stays, as after any run)


# TensorBoard's writer thread meets the full disk too; the CLI keeps its report off the console (no_stray_tracebacks).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_disk_full_when_tensorboard_starts_is_a_write_error(tmpfs):
    """The TensorBoard writer writes its first event as it is created: on a full disk that is the sink's DiskFull,
    naming the folder (the run's one paragraph), not the writer's own OSError."""
    from runner.errors import DiskFull
    from runner.training.loggers import TensorBoardSink

    (tmpfs / "run").mkdir()
    try:
        (tmpfs / "filler").write_bytes(b"\0" * 2049 * 1024)  # more than the disk holds
    except OSError:
        pass
    assert os.statvfs(tmpfs).f_bavail == 0  # every page taken
    with pytest.raises(DiskFull, match=f"holding {tmpfs / 'run' / 'tensorboard'} while writing the TensorBoard event"):
        TensorBoardSink(tmpfs / "run")


def _start(cwd: Path, *overrides: str) -> subprocess.Popen:
    """The CLI in its own session (so the test can signal the whole group, as a terminal's Ctrl-C does)."""
    return subprocess.Popen([sys.executable, "-m", "runner", *overrides, "hydra.run.dir=run"], cwd=cwd,
                            env={**os.environ, **HELPERS_ENV, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_training(run_dir: Path, proc: subprocess.Popen, steps: int = 2) -> None:
    def trained() -> bool:
        rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
        assert proc.poll() is None, proc.communicate()
        return sum("train/loss" in row for row in rows) >= steps

    wait_for(trained, f"{steps} logged training steps in {run_dir / 'metrics.jsonl'}")


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT_S)  # a deadline for a stuck process, not a slow one
    return proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_stops_every_rank_and_saves(tmp_path, sig):
    """A signal to the launcher stops every rank within a step or two; exit 75 means the named checkpoint was saved."""
    proc = _start(tmp_path, *FORK, *SLOW)
    _wait_for_training(tmp_path / "run", proc)
    proc.send_signal(sig)
    code, out, err = _finish(proc)
    assert code == 75, err
    line = err.strip().splitlines()[-1]
    step = int(re.search(rf"runner: stopped by {sig.name} after optimizer step (\d+); saved ", line).group(1))
    saved = tmp_path / "run" / "checkpoints" / f"step_{step:08d}"
    assert f"saved {saved}" in line and damage(saved) is None  # it says what it really wrote
    assert read_pointer(tmp_path / "run" / "checkpoints") == saved.name
    logged = max(row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    assert step <= logged + 2  # within a step or two of the signal, not at some later cadence
    assert "Traceback" not in out + err


def test_a_second_sigterm_still_seals_and_exits_75(tmp_path):
    """The second SIGTERM arrives while the first one is still stopping the run."""
    proc = _start(tmp_path, *FORK, *SLOW)
    _wait_for_training(tmp_path / "run", proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # the scheduler's second notice, to every process of the job
    code, _, err = _finish(proc)
    assert code == 75, err
    assert damage(tmp_path / "run" / "checkpoints" / read_pointer(tmp_path / "run" / "checkpoints")) is None


def test_a_stop_with_checkpoints_off_says_the_run_starts_over(tmp_path):
    """Exit 75 (the scheduler may requeue it), but no advice to resume: nothing was saved to continue from."""
    proc = _start(tmp_path, *SLOW, "checkpoint.enabled=false")
    _wait_for_training(tmp_path / "run", proc)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc)
    assert code == 75, err
    line = err.strip().splitlines()[-1]
    assert "checkpoints are off, nothing was saved; the same command starts it over" in line and "resume" not in line


def test_no_stop_signals_leaves_sigterm_its_default_action(tmp_path):
    """checkpoint.stop_signals=[] keeps a signal's default action while the run trains (docs/checkpoints.md): the
    process ends by SIGTERM, without the start-up report that nothing was trained (it had trained)."""
    proc = _start(tmp_path, *SLOW, "checkpoint.stop_signals=[]")
    _wait_for_training(tmp_path / "run", proc)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc)
    assert code == -signal.SIGTERM, err
    assert "nothing was trained" not in out + err


def test_ctrl_c_prints_one_line_and_ends_every_process(tmp_path):
    proc = _start(tmp_path, *FORK, *SLOW)
    _wait_for_training(tmp_path / "run", proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the whole foreground group
    code, out, err = _finish(proc)  # ends: the launcher gives the workers 3 s, then kills them (no timing here)
    assert code == 130, err
    assert err.strip().splitlines()[-1].startswith("runner: interrupted (Ctrl-C); ")
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err


def test_a_sigterm_during_start_up_exits_75(tmp_path):
    """It says nothing was trained or saved, with no traceback."""
    proc = _start(tmp_path, *SMALL, "data.num_train=200000")  # generating the data takes a few seconds
    wait_for((tmp_path / "run" / "config.yaml").is_file, "preflight to write run/config.yaml", poll_s=0.01)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc)
    assert code == 75, err
    assert "runner: stopped by SIGTERM before training started; nothing was trained or saved" in err
    assert "Traceback" not in out + err


def test_a_sigterm_while_waiting_for_the_other_machines_exits_75(tmp_path):
    """Machine 0 of 2, its peer never comes: the launcher waits at the rendezvous with no worker to pass a stop
    signal on to. It ignored SIGTERM until hardware.timeout_s (600 s); it ends at once."""
    port = free_port()
    proc = _start(tmp_path, *FORK, *SMALL, "hardware.num_machines=2", "hardware.machine_rank=0",
                  "hardware.main_process_ip=127.0.0.1", f"hardware.main_process_port={port}")
    wait_for(lambda: "launching 2 worker process(es) on machine 0 of 2" in (tmp_path / "run" / "runner.log").read_text()
             if (tmp_path / "run" / "runner.log").is_file() else False, "the launcher to wait for machine 1",
             poll_s=0.05)
    time.sleep(0.5)  # inside the rendezvous
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)  # it used to wait out hardware.timeout_s
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still waiting for the other machine 60 s after SIGTERM:\n{err[-2000:]}")
    code = proc.returncode
    assert code == 75, err
    assert "runner: stopped by SIGTERM before training started; nothing was trained or saved" in err
    assert "Traceback" not in out + err


def test_a_sigterm_after_preflight_is_reported_too(tmp_path):
    """The signal lands after preflight wrote config.yaml and before the worker installs its own handler (the
    moment the test above waits for): still exit 75 and one line, never the default action's silent death."""
    probe = ("import os, signal, sys\n"
             "import runner.commands.cli as cli\n"
             "cli.launch = lambda spec: os.kill(os.getpid(), signal.SIGTERM) or {}\n"
             "cli.main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", probe, *SMALL, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 75, done.stderr[-2000:]
    assert "runner: stopped by SIGTERM before training started; nothing was trained or saved" in done.stderr
    assert (tmp_path / "run" / "config.yaml").is_file() and "Traceback" not in done.stdout + done.stderr


def test_a_hung_rank_is_named_within_the_timeout(tmp_path):
    result = run_cli(*FORK, *SMALL, *FAULTY, "+model.hang_rank=1", "+model.hang_at_forward=3",
                     "hardware.timeout_s=6", cwd=tmp_path, env=HELPERS_ENV, timeout=WAIT_S)
    assert result.returncode == 1, result.output
    assert re.search(r"runner: error: rank 1 hung: it made no progress for \d+ s \(at optimizer step 2\); rank 0 "
                     r"gave up waiting for it after hardware.timeout_s=6 s", result.stderr), result.stderr
    assert "runner_rank1.log" in result.stderr and "Traceback" not in result.output


def test_kill_during_a_hang_leaves_no_worker(tmp_path):
    """Killing the launcher (SIGKILL) while rank 1 hangs in a collective ends every worker process."""
    hanging = tmp_path / "rank1_hangs"
    proc = _start(tmp_path, *FORK, *SMALL, *FAULTY, "+model.hang_rank=1", "+model.hang_at_forward=3",
                  f"+model.hang_marker={hanging}")

    def worker_pids() -> list[int]:
        logs = [path.read_text() for path in (tmp_path / "run").glob("runner_rank*.log")]
        pids = [int(m.group(1)) for text in logs for m in [re.search(r"pid (\d+)", text)] if m]
        return pids if len(pids) == 2 else []

    pids = wait_for(worker_pids, "both ranks to log their pid in run/runner_rank*.log")
    wait_for(hanging.is_file, f"rank 1 to enter its hang ({hanging})")  # rank 0 then waits for it in a collective
    proc.kill()
    proc.communicate()
    wait_for(lambda: not any(_alive(pid) for pid in pids), f"worker processes {pids} to end after the launcher died")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False
