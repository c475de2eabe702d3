"""Helpers for exact-resume tests (tests/training/test_resume.py, test_stop_in_eval.py, tests/gpu): a tiny run that
checkpoints often, started in its own session and held after a checkpoint, killed or signalled, then compared with
an uninterrupted run, bitwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import ROOT, read_jsonl, read_scalars, wait_for
from conftest import run_cli as run_cli_with
from dist_helpers import read_global_batches
from runner.checkpoint import complete_checkpoints

# 256 rows / 16 per batch = 16 batches per epoch, 2 epochs; a checkpoint every 3 optimizer steps.
RUN = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=16", "trainer.progress_bar=false",
       "trainer.max_epochs=2", "trainer.log_every_steps=2", "trainer.eval_every_steps=10", "checkpoint.every_n_steps=3",
       # Holds a run that start() interrupts after its checkpoint (tests/dist_helpers.py); does nothing elsewhere.
       "allowed_targets=[runner.,torch.,dist_helpers.]", "+callbacks.hold._target_=dist_helpers.HoldAfterCheckpoint")
TIMING_KEYS = ("train/samples_per_s", "train/tokens_per_s", "train/flops_per_s", "train/mfu")  # wall-clock rates
# tests/ on the path of the runs (and their workers), for dist_helpers.HoldAfterCheckpoint.
HELPERS_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def run_cli(*overrides: str, cwd: Path, rows: Path | None = None, env: dict | None = None):
    """`rows`: a new folder where every rank records the rows it trains on (dist_helpers.HoldAfterCheckpoint);
    `env`: more variables for the run (tests/ is on its PYTHONPATH either way)."""
    env = {**HELPERS_ENV, **(env or {})}
    if rows is not None:
        rows.mkdir(parents=True)
        env["RUNNER_TEST_ROWS"] = str(rows)
    return run_cli_with(*overrides, cwd=cwd, env=env)


def assert_same_rows(rows: Path, processes: int, reference_rows: Path, reference_processes: int,
                     after_step: int) -> None:
    """Each optimizer step recorded in `rows` (all those after `after_step`, to the end of the run) took the global
    batch the reference took at that step: the same rows in the same order."""
    expected = read_global_batches(reference_rows, reference_processes)
    got = read_global_batches(rows, processes)
    assert min(got) == after_step + 1 and max(got) == max(expected), (sorted(got), max(expected))
    for step, batch in got.items():
        assert batch == expected[step], f"step {step}: other rows, or in another order"


def start(cwd: Path, run_dir: Path, hold_after: int, *overrides: str) -> subprocess.Popen:
    """The CLI in its own session, so a kill can take its worker processes too (as when a node dies). It holds
    still after its first checkpoint at step >= hold_after until it is killed or signalled."""
    env = {**os.environ, **HELPERS_ENV, "PYTHONUNBUFFERED": "1", "RUNNER_TEST_HOLD": f"{hold_after}:{cwd}"}
    return subprocess.Popen([sys.executable, "-m", "runner", *RUN, f"hydra.run.dir={run_dir}", *overrides], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def kill_everything(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group has ended already
        pass
    proc.wait()
    proc.stdout.close()


def wait_for_checkpoint(cwd: Path, run_dir: Path, proc: subprocess.Popen, min_step: int) -> int:
    """Waits until the run start() began in cwd holds and its checkpoint at min_step or later is sealed (sealing
    goes on in a background thread while the run holds); returns that checkpoint's step."""
    def sealed() -> int | None:
        found = complete_checkpoints(run_dir / "checkpoints")
        return found[-1][1]["step"] if found and found[-1][1]["step"] >= min_step else None

    try:
        wait_for(lambda: (cwd / "held_rank0").exists() or proc.poll() is not None,
                 f"the run to hold after a checkpoint ({cwd / 'held_rank0'})")
        assert proc.poll() is None, f"the run ended before holding:\n{proc.stdout.read()}"
        return wait_for(sealed, f"a sealed checkpoint at step >= {min_step} in {run_dir / 'checkpoints'}")
    except BaseException:
        kill_everything(proc)  # a held run left behind would hold for minutes
        raise


def logged(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in read_jsonl(run_dir / "metrics.jsonl")]


def assert_same_run(resumed: Path, reference: Path) -> None:
    final, expected = load_file(resumed / "export" / "final.safetensors"), load_file(reference / "export" / "final.safetensors")
    assert final.keys() == expected.keys()
    for name in expected:
        assert torch.equal(final[name], expected[name]), f"{name} differs after resume"
    assert logged(resumed) == logged(reference)
    losses = read_scalars(resumed, "train/loss")
    assert losses == read_scalars(reference, "train/loss")  # TensorBoard: no step twice, same values
    assert len({step for step, _ in losses}) == len(losses)
