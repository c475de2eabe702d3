"""Where callbacks, checkpoints and the end of a run meet: a run killed right after a checkpoint and resumed ends
bitwise like an uninterrupted one with every built-in callback and a user's stateful callback (a step's events have
one order: on_step_end, evaluation, checkpoint); and the end of a run is idempotent: an early stop on a step just
checkpointed still exports, and `resume=auto` on a finished run writes whatever final artifact it lacks."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY, read_jsonl, run_cli, run_in_process

# A test helper module in the run's working directory (`python -m runner` imports from there).
HELPERS = textwrap.dedent('''
    import json
    import os
    import signal

    from runner.training.callbacks import Callback


    class StepTally(Callback):
        """Counts on_step_end calls in its state: a resumed run must continue the count exactly."""

        def __init__(self):
            self.steps = 0

        def on_step_end(self, loop):
            self.steps += 1

        def on_fit_end(self, loop, final):
            if self.run.writes_files:
                (self.run.run_dir / "tally.json").write_text(json.dumps({"steps": self.steps}))

        def state_dict(self):
            return {"steps": self.steps}

        def load_state_dict(self, state):
            self.steps = state["steps"]


    class KillAfterCheckpoint(Callback):
        """SIGKILL (as when a node dies) once the checkpoint of step `at_step` is sealed; once per run dir."""

        def __init__(self, at_step):
            self.at_step = at_step

        def on_save(self, loop, path):
            marker = self.run.run_dir / "killed_once"
            if loop.state.step == self.at_step and not marker.exists():
                loop.checkpointer.wait()
                marker.write_text("")
                os.kill(os.getpid(), signal.SIGKILL)


    class BlockFinalExport(Callback):
        """Makes the final export's temporary file impossible to create, once per run dir: its write fails with an
        OSError, as on a full disk, without a small disk to mount."""

        def on_fit_start(self, loop):
            marker = self.run.run_dir / "blocked_once"
            if self.run.writes_files and not marker.exists():
                marker.write_text("")
                blocker = self.run.run_dir / "export" / ".partial-final.safetensors"
                blocker.mkdir(parents=True)
                (blocker / "in_the_way").write_text("")
''')

CALLBACKS = ("callbacks=[early_stopping,ema,lr_monitor,throughput,profiler]", "callbacks.early_stopping.patience=50",
             "callbacks.ema.decay=0.9", "+callbacks.tally._target_=runhelpers.StepTally",
             "allowed_targets=[runner.,torch.,datasets.,runhelpers.]")
RUN = (*TINY, "trainer.max_steps=12", "trainer.eval_every_steps=4", "trainer.log_every_steps=2",
       "checkpoint.every_n_steps=3", "logger=[tensorboard]", *CALLBACKS)
# Wall-clock rates: the only logged values that may differ.
TIMING = ("train/samples_per_s", "train/tokens_per_s", "train/flops_per_s", "train/mfu", "perf/")


@pytest.fixture
def cwd(tmp_path) -> Path:
    (tmp_path / "runhelpers.py").write_text(HELPERS)
    return tmp_path


def _logged(run_dir: Path) -> list[dict]:
    return [{key: value for key, value in row.items() if not key.startswith(TIMING)}
            for row in read_jsonl(run_dir / "metrics.jsonl")]


def _assert_same_tensors(path: Path, reference: Path) -> None:
    mine, expected = load_file(path), load_file(reference)
    assert mine.keys() == expected.keys()
    for name in expected:
        assert torch.equal(mine[name], expected[name]), f"{path.name}: {name} differs from the uninterrupted run"


def test_callbacks_resume_bitwise_after_a_kill(cwd):
    """Killed right after a checkpoint and resumed, every callback ends bitwise as uninterrupted."""
    reference = run_cli(*RUN, "hydra.run.dir=reference", cwd=cwd)
    assert reference.returncode == 0, reference.output
    run_dir = cwd / "run"
    killed_run = (*RUN, f"hydra.run.dir={run_dir}", "+callbacks.kill._target_=runhelpers.KillAfterCheckpoint",
                  "+callbacks.kill.at_step=6")
    killed = run_cli(*killed_run, cwd=cwd)
    assert killed.returncode == -9, killed.output
    assert not (run_dir / "export").exists() and (run_dir / "killed_once").is_file()
    state = torch.load(run_dir / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    assert state["loop"]["callbacks"]["tally"] == {"steps": 6}  # the checkpoint of step 6 counts step 6
    assert state["loop"]["callbacks"]["ema"]["updates"] == 6
    resumed = run_cli(*killed_run, "resume=auto", cwd=cwd)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.output and "step 6" in resumed.output

    expected = cwd / "reference"
    assert json.loads((run_dir / "tally.json").read_text()) == {"steps": 12}
    assert json.loads((expected / "tally.json").read_text()) == {"steps": 12}
    _assert_same_tensors(run_dir / "export" / "ema.safetensors", expected / "export" / "ema.safetensors")
    _assert_same_tensors(run_dir / "export" / "final.safetensors", expected / "export" / "final.safetensors")
    ema_rows = [row for row in _logged(run_dir) if any(key.startswith("val_ema/") for key in row)]
    assert [row["step"] for row in ema_rows] == [4, 8, 12]
    assert _logged(run_dir) == _logged(expected)


def test_early_stop_on_a_checkpointed_step_exports(cwd, capsys):
    # Evaluated and checkpointed every 2 steps; no improvement of 10 is possible: early stopping ends it at step 4,
    # on the step its scheduled checkpoint was just taken.
    run_dir = cwd / "run"
    result = run_in_process(*TINY, "trainer.max_steps=12", "trainer.eval_every_steps=2", "checkpoint.every_n_steps=2",
                            "callbacks=[early_stopping,ema]", "callbacks.early_stopping.patience=1",
                            "callbacks.early_stopping.min_delta=10", f"hydra.run.dir={run_dir}", cwd=cwd, capsys=capsys)
    assert result.returncode == 0, result.output
    assert "early stopping at step 4" in result.output
    steps = sorted(path.name for path in (run_dir / "checkpoints").glob("step_*"))
    assert steps == ["step_00000002", "step_00000004"]  # no second checkpoint of step 4
    assert json.loads((run_dir / "export" / "final.json").read_text())["step"] == 4
    _assert_same_tensors(run_dir / "export" / "final.safetensors",
                         run_dir / "checkpoints" / "step_00000004" / "model.safetensors")
    assert (run_dir / "export" / "ema.safetensors").is_file()
    recorded = json.loads((run_dir / "result.json").read_text())
    assert recorded["status"] == "completed" and recorded["stopped_early"].startswith("early stopping at step 4")


def test_a_finished_run_continued_in_a_new_run_dir(cwd, capsys):
    """resume=<run dir> continues another run in a new run dir. From an early stop it trains on (a larger patience
    lets it); from the end of its step budget there is nothing to train, and the message names the key. With the
    ema callback both ended in "could not write .../export": the end-of-run path looked for the other run's
    checkpoint in the new run dir."""
    first, stopped, budget = cwd / "first", cwd / "stopped", cwd / "budget"
    common = (*TINY, "trainer.eval_every_steps=2", "callbacks=[early_stopping,ema]")
    result = run_in_process(*common, "trainer.max_steps=12", "callbacks.early_stopping.patience=1",
                            "callbacks.early_stopping.min_delta=10", f"hydra.run.dir={first}", cwd=cwd, capsys=capsys)
    assert result.returncode == 0 and "early stopping at step 4" in result.output, result.output

    more_patience = run_in_process(*common, "trainer.max_steps=8", "callbacks.early_stopping.patience=10",
                                   f"hydra.run.dir={stopped}", f"resume={first}", cwd=cwd, capsys=capsys)
    assert more_patience.returncode == 0, more_patience.output
    assert "which stopped early (early stopping at step 4" in more_patience.output
    assert json.loads((stopped / "export" / "final.json").read_text())["step"] == 8  # trained on, to its budget
    assert (stopped / "export" / "ema.safetensors").is_file()

    nothing_to_train = run_in_process(*common, "trainer.max_steps=8", f"hydra.run.dir={budget}",
                                      f"resume={stopped}", cwd=cwd, capsys=capsys)
    assert nothing_to_train.returncode == 1, nothing_to_train.output
    assert ("runner: error: bad config: trainer.max_steps: is 8 (max_epochs 3), and "
            f"{stopped / 'checkpoints' / 'step_00000008'} is the end of a finished run (step 8, epoch 1)"
            in nothing_to_train.output), nothing_to_train.output
    assert "trains further only with a larger trainer.max_steps or trainer.max_epochs" in nothing_to_train.output
    assert not budget.exists()  # nothing trained: the new run dir is gone


def test_resume_auto_rewrites_a_deleted_export(cwd, capsys):
    """On a finished run, and it says so."""
    run_dir = cwd / "run"
    run = (*TINY, "trainer.max_steps=4", "callbacks=[ema]", f"hydra.run.dir={run_dir}")
    assert run_in_process(*run, cwd=cwd, capsys=capsys).returncode == 0
    export = run_dir / "export"
    final_bytes, ema_bytes = (export / "final.safetensors").read_bytes(), (export / "ema.safetensors").read_bytes()
    recorded_value = json.loads((export / "final.json").read_text())["val/accuracy"]
    assert recorded_value is not None
    (export / "final.safetensors").unlink()
    (export / "ema.safetensors").unlink()
    (export / "final.json").unlink()

    again = run_in_process(*run, "resume=auto", cwd=cwd, capsys=capsys)
    assert again.returncode == 0, again.output
    assert (f"resume=auto: {run_dir} already finished but lacks export/final.safetensors, export/ema.safetensors; "
            "writing it now from its last checkpoint") in again.output
    assert ("the run already finished at step 4 (" in again.output
            and "wrote what its end had not: export/ema.safetensors, export/final.safetensors" in again.output)
    assert (export / "final.safetensors").read_bytes() == final_bytes
    assert json.loads((export / "final.json").read_text()) == {"step": 4, "val/accuracy": recorded_value}
    assert (export / "ema.safetensors").read_bytes() == ema_bytes
    assert not any(path.name.startswith(".partial-") for path in export.iterdir())
    recorded = json.loads((run_dir / "result.json").read_text())
    assert recorded["status"] == "completed" and {"final.safetensors", "ema.safetensors"} <= set(recorded["exports"])

    nothing_missing = run_in_process(*run, "resume=auto", cwd=cwd, capsys=capsys)
    assert nothing_missing.returncode == 0, nothing_missing.output
    assert "already finished with val/accuracy=" in nothing_missing.output and "lacks" not in nothing_missing.output


def test_resume_auto_keeps_an_export_newer_than_every_checkpoint(cwd, capsys):
    """The last checkpoint lost its manifest after the run finished (a deletion stopped half-way leaves that): the
    export of that step is still the run's result. resume=auto says the run finished and retrains nothing; it used
    to say the run lacked export/final.safetensors and train the last steps again."""
    run_dir = cwd / "run"
    run = (*TINY, "trainer.max_steps=4", "checkpoint.every_n_steps=2", f"hydra.run.dir={run_dir}")
    assert run_in_process(*run, cwd=cwd, capsys=capsys).returncode == 0
    export = run_dir / "export"
    before = {path.name: path.stat().st_mtime_ns for path in export.iterdir()}
    (run_dir / "checkpoints" / "step_00000004" / "manifest.json").unlink()

    again = run_in_process(*run, "resume=auto", cwd=cwd, capsys=capsys)
    assert again.returncode == 0, again.output
    assert f"resume=auto: {run_dir} already finished with val/accuracy=" in again.output
    assert "lacks" not in again.output and "resumed from" not in again.output
    assert {path.name: path.stat().st_mtime_ns for path in export.iterdir()} == before


def test_failed_export_is_fixed_by_suggested_resume(cwd, capsys):
    """A failed final export is written by the resume=auto its message suggests."""
    run_dir = cwd / "run"
    run = (*TINY, "trainer.max_steps=4", f"hydra.run.dir={run_dir}",
           "+callbacks.block._target_=runhelpers.BlockFinalExport",
           "allowed_targets=[runner.,torch.,datasets.,runhelpers.]")
    blocker = run_dir / "export" / ".partial-final.safetensors"
    failed = run_in_process(*run, cwd=cwd, capsys=capsys)
    assert failed.returncode == 1, failed.output
    assert "Traceback" not in failed.output
    message = [line for line in failed.stderr.splitlines() if line.startswith("runner: error:")]
    assert len(message) == 1 and "the export of step_00000004 (the checkpoint itself is complete)" in message[0]
    assert "resume=auto" in failed.stderr
    assert not (run_dir / "export" / "final.safetensors").exists()

    shutil.rmtree(blocker)  # the space freed
    resumed = run_in_process(*run, "resume=auto", cwd=cwd, capsys=capsys)
    assert resumed.returncode == 0, resumed.output
    assert "wrote what its end had not: export/final.safetensors" in resumed.output
    _assert_same_tensors(run_dir / "export" / "final.safetensors",
                         run_dir / "checkpoints" / "step_00000004" / "model.safetensors")
    recorded = json.loads((run_dir / "result.json").read_text())
    assert recorded["status"] == "completed" and recorded["steps"] == 4 and "final.safetensors" in recorded["exports"]
