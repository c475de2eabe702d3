"""Callbacks (runner/training/callbacks.py) and what a run says, read back from one in-process run: early stopping (the
reason in result.json and the log, the checkpoint it saved), EMA (val_ema/* and its export), the learning-rate
and throughput monitors, the profiler's trace, a user's own callback from a package in the working directory,
the CSV sink, the run's name in its dir, and the start and end summaries in the log."""

from __future__ import annotations

import csv
import json
import sys
import textwrap

import pytest
import torch

from conftest import TINY, read_scalars

from runner.training.callbacks import EarlyStopping
from runner.commands.cli import main

USER_CALLBACK = textwrap.dedent('''
    from runner.training.callbacks import Callback

    CALLS = []


    class Recorder(Callback):
        def __init__(self, label):
            self.label = label

        def on_fit_start(self, loop):
            CALLS.append(("fit_start", loop.state.step))

        def on_step_end(self, loop):
            CALLS.append(("step_end", loop.state.step))

        def on_eval_end(self, loop, metrics):
            CALLS.append(("eval_end", loop.state.step, sorted(metrics)))

        def on_save(self, loop, path):
            CALLS.append(("save", loop.state.step, path.name))

        def on_fit_end(self, loop, final):
            CALLS.append(("fit_end", self.label, sorted(final)))
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run of 6 planned steps, evaluated every step, that early stopping ends at step 2."""
    cwd = tmp_path_factory.mktemp("callbacks")
    (cwd / "mycbs.py").write_text(USER_CALLBACK)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))  # what `python -m runner` (and the `runner` script) do for the cwd
    try:
        main([*TINY, "trainer.max_steps=6", "trainer.eval_every_steps=1", "trainer.log_every_steps=1",
              "logger=[tensorboard,csv]", "callbacks=[early_stopping,ema,lr_monitor,throughput,profiler]",
              "callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=10",
              "callbacks.profiler.wait=0", "+callbacks.mine._target_=mycbs.Recorder", "+callbacks.mine.label=x",
              "allowed_targets=[runner.,torch.,datasets.,mycbs.]", "logging.name=probe run",
              "logging.tags=[baseline,cpu]"])
        import mycbs

        (run_dir,) = [path.parent for path in (cwd / "outputs").rglob("result.json")]
        yield run_dir, list(mycbs.CALLS)
    finally:
        sys.modules.pop("mycbs", None)
        monkeypatch.undo()


def test_early_stopping_saves_and_records_why(run):
    """Early stopping ends the run, saves it and records why."""
    run_dir, _ = run
    result = json.loads((run_dir / "result.json").read_text())
    reason = (f"early stopping at step 2: val/accuracy did not improve by more than 10 on {result['best_value']:.4f} "
              "(step 1) for 1 evaluation(s)")
    assert result["steps"] == 2 and result["stopped_early"] == reason
    assert reason in (run_dir / "runner.log").read_text()
    manifest = json.loads((run_dir / "checkpoints" / "step_00000002" / "manifest.json").read_text())
    assert manifest["step"] == 2
    state = torch.load(run_dir / "checkpoints" / "step_00000002" / "state.pt", weights_only=True)
    assert state["loop"]["stop_reason"] == reason
    assert state["loop"]["callbacks"]["early_stopping"] == {"best": result["best_value"], "best_step": 1,
                                                            "bad_evaluations": 1}


def test_ema_is_evaluated_and_exported_separately(run):
    """The EMA weights are evaluated and exported apart from the final weights."""
    from safetensors.torch import load_file

    run_dir, _ = run
    assert [step for step, _ in read_scalars(run_dir, "val_ema/accuracy")] == [1, 2]
    ema, final = load_file(run_dir / "export" / "ema.safetensors"), load_file(run_dir / "export" / "final.safetensors")
    assert ema.keys() == final.keys()
    assert any(not torch.equal(ema[name], final[name]) for name in ema)
    shadow = torch.load(run_dir / "checkpoints" / "step_00000002" / "state.pt", weights_only=True)["loop"]["callbacks"]["ema"]
    assert shadow["updates"] == 2 and len(shadow["shadow"]) == len(ema)


def test_lr_throughput_and_trace_are_recorded(run):
    """The learning rate, throughput and the profiler trace."""
    run_dir, _ = run
    lr = read_scalars(run_dir, "train/lr_group0")
    assert [step for step, _ in lr] == [1, 2] and lr == read_scalars(run_dir, "train/lr")
    assert [value for _, value in read_scalars(run_dir, "train/momentum_group0")] == pytest.approx([0.9, 0.9])
    step_times = read_scalars(run_dir, "perf/step_time_s")
    assert [step for step, _ in step_times] == [1, 2] and all(value > 0 for _, value in step_times)
    (trace,) = (run_dir / "profiler").glob("rank0.*.pt.trace.json")
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= names  # warm-up step 1, then recording until the stop


def test_user_callback_gets_every_hook_in_order(run):
    """A user's callback from the working directory."""
    _, calls = run
    metrics = ["val/accuracy", "val/loss"]
    # A step's events in the documented order: on_step_end, then evaluation, then the checkpoint.
    assert calls == [("fit_start", 0), ("step_end", 1), ("eval_end", 1, metrics), ("step_end", 2),
                     ("eval_end", 2, metrics), ("save", 2, "step_00000002"), ("fit_end", "x", metrics)]


def test_csv_sink_and_the_run_name_in_the_dir(run):
    run_dir, _ = run
    assert run_dir.name.endswith("_probe-run")
    with open(run_dir / "csv" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["step"] for row in rows if row["train/loss"]] == ["1", "2"]
    assert len({row["step"] for row in rows}) == len(rows)  # one row per step: evaluation joins training's row
    assert [float(row["val/accuracy"]) for row in rows if row["val/accuracy"]] == pytest.approx(
        [value for _, value in read_scalars(run_dir, "val/accuracy")])  # TensorBoard keeps float32
    hparams = dict(row.split(",", 1) for row in (run_dir / "csv" / "hparams.csv").read_text().splitlines()[1:])
    assert hparams["logging.name"] == "probe run" and hparams["trainer.max_steps"] == "6"
    assert float(hparams["final/val/accuracy"]) == json.loads((run_dir / "result.json").read_text())["value"]


def test_the_log_says_where_what_and_how_long(run):
    run_dir, _ = run
    text = (run_dir / "runner.log").read_text()
    result = json.loads((run_dir / "result.json").read_text())
    assert f"run dir: {run_dir} (follow it live: tensorboard --logdir {run_dir})" in text
    assert "model SeqTransformer: 69,130 parameters (69,130 trainable)\n  encoder  TransformerEncoder" in text
    assert "data: train 256 samples, validation 64 samples" in text
    assert "schedule: 8 optimizer steps per epoch, 6 in total" in text
    assert "batch: 32 global per optimizer step" in text
    best = f"best {result['best_value']:.4f} at step 1 (max); exports in {run_dir / 'export'}: "
    assert f"val/accuracy final {result['value']:.4f}, {best}" in text and "ema.safetensors" in text
    assert text.index("run dir:") < text.index("model SeqTransformer") < text.index("done in")


@pytest.mark.parametrize("arguments, message", [
    ({"patience": 0}, "patience is 0; it must be 1 or more"),
    ({"min_delta": -1.0}, "min_delta is -1.0; it must be 0 or more"),
    ({"mode": "up"}, "mode is 'up'; it must be min, max or null"),
])
def test_early_stopping_refuses_bad_settings(arguments, message):
    with pytest.raises(ValueError, match=message):
        EarlyStopping(**arguments)


def test_callback_state_is_resumed_with_the_loop():
    """Callback state travels with the loop state, so a resumed run continues it."""
    from test_loop import _loop

    from runner.training.callbacks import EMA, Callbacks
    from runner.config import TrainerConfig

    settings = TrainerConfig(max_steps=4, batch_size=16, eval_every_steps=2, log_every_steps=2)
    loop, _, _ = _loop(settings)
    loop.callbacks = Callbacks({"early_stopping": EarlyStopping(patience=5), "ema": EMA(decay=0.9, export=False)})
    loop.fit()
    state = loop.state_dict()["loop"]
    resumed, _, _ = _loop(settings)
    resumed.callbacks = Callbacks({"early_stopping": EarlyStopping(patience=5), "ema": EMA(decay=0.9, export=False)})
    resumed.load_state_dict(state, {"running_loss": torch.zeros(())})
    stopping, ema = resumed.callbacks.named["early_stopping"], resumed.callbacks.named["ema"]
    assert stopping.state_dict() == loop.callbacks.named["early_stopping"].state_dict()
    assert stopping.best_step in (2, 4) and ema.updates == 4
    assert all(torch.equal(a, b) for a, b in zip(ema.shadow, loop.callbacks.named["ema"].shadow))


def test_ema_under_multi_process_fsdp_is_refused():
    """FSDP on several processes; the error names the callback."""
    from types import SimpleNamespace

    from runner.training.callbacks import EMA
    from runner.errors import ConfigError

    loop = SimpleNamespace(accelerator=SimpleNamespace(shards_parameters=True))
    with pytest.raises(ConfigError, match=r"callbacks.ema: is not supported with parallel=fsdp on several processes"):
        EMA().on_fit_start(loop)
