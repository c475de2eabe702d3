"""Accelerate's two NLP examples (examples/nlp_example.py and complete_nlp_example.py, written again in
tests/accelerate/examples/ on a local tiny BERT and paraphrase task, since the Hub cannot be reached) run under
Accelerate itself and with only the import swapped for `from runner import ...`, on 1 and 2 CPU processes, each
launched as its users launch it (torchrun for Accelerate, `python -m runner.launch` for the runner). Both must record
the same loss at every step on every process, the same metrics after every epoch, and, for the complete example,
the same checkpoints, the same TensorBoard scalars and (on 2 processes) the same losses after resuming
mid-epoch from a checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, PipeReader

pytest.importorskip("accelerate", reason="the test extra installs accelerate")
psutil = pytest.importorskip("psutil", reason="accelerate requires psutil")
pytest.importorskip("transformers", reason="the test extra installs transformers")
EXAMPLES = Path(__file__).parent / "examples"
ACCELERATE_IMPORT = "from accelerate import "


def script(name: str, accelerator: str, directory: Path) -> Path:
    """The example as written (accelerator="accelerate") or with its one Accelerate import made the runner's."""
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    assert text.count(ACCELERATE_IMPORT) == 1, f"{name}: expected one line importing from accelerate"
    if accelerator == "runner":
        text = text.replace(ACCELERATE_IMPORT, "from runner import ")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


# Accelerate's arm can hang after it has recorded everything, as it tears down: its end_training destroys the
# process group, the DDP model's Reducer then drops the group's last reference holding the GIL, and the group's
# destructor waits for a gloo thread that needs the GIL to free the last all_gather's tensors (torch's pybind
# destructors that block, pytorch/pytorch#56297; seen here in 2 of 4 two-process resumed runs). That arm is the
# reference, so a run of it that has written every record and not exited TEARDOWN_GRACE_S later is stopped and
# its records used (they are written last, after end_training, each file whole); the runner's arm must exit by itself.
TEARDOWN_GRACE_S = 3


def run(name: str, accelerator: str, processes: int, directory: Path, *args: str) -> dict:
    """Run the example in `directory` and return what it recorded: losses per rank, metrics per epoch."""
    path = script(name, accelerator, directory)
    if processes == 1:
        launch = []
    elif accelerator == "runner":
        launch = ["-m", "runner.launch", "hardware=multi_cpu", f"hardware.num_processes={processes}"]
    else:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    path_entries = [str(EXAMPLES), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path_entries), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    record = directory / "record"
    files = [record / "metrics.json", *(record / f"losses_rank{rank}.json" for rank in range(processes))]
    with subprocess.Popen([sys.executable, *launch, str(path), "--cpu", "--record", str(record), *args],
                          cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        output = PipeReader(process)
        recorded_at = None
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            if recorded_at is None and all(file.exists() for file in files):
                recorded_at = time.monotonic()
            if accelerator == "accelerate" and recorded_at and time.monotonic() - recorded_at > TEARDOWN_GRACE_S:
                break
            time.sleep(0.5)
        hung = process.poll() is None
        if hung:  # the launcher and every worker: torch's elastic agent starts each worker in a session of its own
            for survivor in [*psutil.Process(process.pid).children(recursive=True), psutil.Process(process.pid)]:
                try:
                    survivor.kill()
                except psutil.NoSuchProcess:
                    pass
        stdout, stderr = output.join()
    assert not (hung and recorded_at is None), f"{accelerator}: no records in 600 s: {stdout[-3000:]}{stderr[-3000:]}"
    assert accelerator == "accelerate" or not hung, f"runner: recorded, then hung: {stdout[-3000:]}{stderr[-3000:]}"
    assert hung or process.returncode == 0, f"{accelerator}: {stdout[-3000:]}{stderr[-3000:]}"
    recorded = json.loads(files[0].read_text())
    recorded["losses"] = [json.loads(file.read_text()) for file in files[1:]]
    recorded["stdout"] = stdout
    return recorded


# On 2 processes only: the complete example below runs the same calls on 1 process (and checks that it learns).
def test_nlp_example_gives_accelerates_losses(tmp_path, processes=2, precision="bf16"):
    """nlp_example: prepare of model, optimizer, both loaders and the schedule, backward, gather_for_metrics, and
    mixed_precision read back to pad batches (to a multiple of 8 unless it is "no")."""
    theirs = run("nlp_example.py", "accelerate", processes, tmp_path / "accelerate", "--mixed_precision", precision)
    ours = run("nlp_example.py", "runner", processes, tmp_path / "runner", "--mixed_precision", precision)
    assert ours["mixed_precision"] == theirs["mixed_precision"] == precision
    assert ours["num_processes"] == theirs["num_processes"] == processes
    steps = 3 * 160 // (16 * processes)  # 3 epochs of 160 rows, 16 a process a step, the last part dropped
    assert [len(losses) for losses in theirs["losses"]] == [steps] * processes
    assert ours["losses"] == theirs["losses"]
    assert ours["metrics"] == theirs["metrics"]
    assert all(epoch["count"] == 48 for epoch in ours["metrics"])  # gather_for_metrics dropped the padding rows


def tensorboard_scalars(directory: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = (directory / "logs").iterdir()
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


# The resume runs on 2 processes only, where each rank's generator and share of the epoch must come back: its two
# extra launches cost about as much as a 1-process test (the suite has a time budget).
@pytest.mark.parametrize("processes,precision,resume_at", [(1, "no", None), (2, "no", 8)])
def test_complete_nlp_example_gives_accelerates_losses_and_resumes(tmp_path, processes, precision, resume_at):
    """complete_nlp_example: a checkpoint every 4 steps (save_state), TensorBoard through log_with="all", then (on 2
    processes) a second run resumed mid-epoch from one of them (load_state, skip_first_batches)."""
    runs = {}
    for accelerator in ("accelerate", "runner"):
        directory = tmp_path / accelerator
        full = run("complete_nlp_example.py", accelerator, processes, directory, "--mixed_precision", precision,
                   "--checkpointing_steps", "4", "--with_tracking", "--output_dir", "checkpoints")
        checkpoints = sorted(path.name for path in (directory / "checkpoints").iterdir())
        scalars = tensorboard_scalars(directory)
        resumed = None if resume_at is None else run(
            "complete_nlp_example.py", accelerator, processes, tmp_path / f"{accelerator}_resumed",
            "--mixed_precision", precision,
            "--resume_from_checkpoint", str(directory / "checkpoints" / f"step_{resume_at}"))
        runs[accelerator] = full, checkpoints, scalars, resumed
    (theirs, their_checkpoints, their_scalars, their_resume), (ours, checkpoints, scalars, resume) = runs.values()

    steps_per_epoch = -(-160 // (16 * processes))  # the last batch kept (short, or made even from the start)
    assert ours["steps"] == theirs["steps"] == 3 * steps_per_epoch
    assert ours["losses"] == theirs["losses"]
    assert ours["metrics"] == theirs["metrics"]
    assert checkpoints == their_checkpoints == sorted(f"step_{n}" for n in range(4, 3 * steps_per_epoch + 1, 4))
    assert set(scalars) >= {"accuracy", "f1", "train_loss", "epoch"}
    assert scalars == their_scalars
    if resume_at is None:  # 1 process: it learns (same numbers, and not noise); 2 processes stay near 0.5 here
        assert ours["metrics"][-1]["accuracy"] > 0.8, ours["metrics"]
        return
    assert f"Resumed from checkpoint: {tmp_path / 'runner' / 'checkpoints' / f'step_{resume_at}'}" in resume["stdout"]
    assert resume["steps"] == their_resume["steps"] == 3 * steps_per_epoch
    assert len(resume["losses"][0]) == 3 * steps_per_epoch - resume_at
    assert resume["losses"] == their_resume["losses"]
    assert resume["metrics"] == their_resume["metrics"]
