"""The sinks (runner/training/loggers.py), each read back from what it wrote: TensorBoard events, metrics.jsonl, CSV, W&B's
offline run files; the main process alone writes."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from conftest import read_jsonl, read_scalars

from runner.training.loggers import CsvSink, JsonlSink, Loggers, NullLogger, RunInfo, TensorBoardSink, make_logger

TB = {"_target_": "runner.loggers.TensorBoardSink", "_partial_": True}
CSV = {"_target_": "runner.loggers.CsvSink", "_partial_": True}


def test_tensorboard_gets_scalars_config_and_hparams(tmp_path):
    """The run's name, tags and notes too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = Loggers([TensorBoardSink(tmp_path, run=RunInfo("lr-probe", ("baseline", "cpu"), "first try")),
                      JsonlSink(tmp_path)])
    logger.log(1, {"train/loss": 2.0})
    logger.log(2, {"train/loss": 1.5, "val/accuracy": 0.5})
    logger.log_config({"model": {"_target_": "runner.models.MLP"}, "seed": 0})
    logger.log_final({"optimizer": {"lr": 0.1}, "gpu_ids": None}, {"val/accuracy": 0.5})
    logger.close()

    assert read_scalars(tmp_path, "train/loss") == [(1, 2.0), (2, 1.5)]
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.5, "val/accuracy": 0.5}
    ]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert "runner.models.MLP" in events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert events.Tensors("run/text_summary")[0].tensor_proto.string_val[0].decode() == (
        "**lr-probe**\n\ntags: baseline, cpu\n\nfirst try")
    assert read_scalars(tmp_path, "hparam/val/accuracy") == [(0, 0.5)]
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["optimizer.lr"].number_value == 0.1
    assert session.hparams["gpu_ids"].string_value == "None"


def test_tensorboard_batches_quick_events_intact(tmp_path, monkeypatch):
    """Quick events are handed over in batches, and every one arrives with its step and time."""
    from types import SimpleNamespace

    import runner.training.loggers

    sink = TensorBoardSink(tmp_path)
    clock = SimpleNamespace(time=lambda: 1000.0, monotonic=lambda: 50.0)  # the sink's clock, not the writer's
    monkeypatch.setattr(runner.training.loggers, "time", clock)
    sink.log(1, {"train/loss": 1.0})  # the first event goes over at once: nothing was handed over before
    clock.time = lambda: 2000.0
    for step in range(2, 2 + TensorBoardSink.HAND_OVER_EVENTS - 1):  # quick succession: they wait
        sink.log(step, {"train/loss": float(step)})
    assert [step for step, _, _ in sink._pending] == list(range(2, 1 + TensorBoardSink.HAND_OVER_EVENTS))
    last = 1 + TensorBoardSink.HAND_OVER_EVENTS
    sink.log(last, {"train/loss": float(last)})  # the queue's worth: handed over together
    assert sink._pending == []
    sink.log(last + 1, {"train/loss": last + 1.0})
    clock.monotonic = lambda: 50.0 + TensorBoardSink.HAND_OVER_SECONDS  # a second on: the next one takes it along
    sink.log(last + 2, {"train/loss": last + 2.0})
    assert sink._pending == []
    sink.log(last + 3, {"train/loss": last + 3.0})
    sink.close()  # hands over what is left

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [(event.step, event.value) for event in scalars] == [
        *[(step, float(step)) for step in range(1, last + 4)]]
    assert [event.wall_time for event in scalars] == [1000.0] + [2000.0] * (len(scalars) - 1)


def test_csv_one_row_per_step_widens_for_new_metrics(tmp_path):
    sink = CsvSink(tmp_path)
    sink.log(1, {"train/loss": 2.0})
    sink.log(2, {"train/loss": 1.5})
    sink.log(2, {"val/accuracy": 0.5})  # a new column, for the step already written
    sink.log(3, {"train/loss": 1.4})
    sink.log(3, {"val/accuracy": 0.75})  # a known column, for the step already written
    sink.log_final({"optimizer": {"lr": 0.1}}, {"val/accuracy": 0.75})
    sink.close()
    with open(tmp_path / "csv" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows == [{"step": "1", "train/loss": "2.0", "val/accuracy": ""},
                    {"step": "2", "train/loss": "1.5", "val/accuracy": "0.5"},
                    {"step": "3", "train/loss": "1.4", "val/accuracy": "0.75"}]
    assert (tmp_path / "csv" / "hparams.csv").read_text().splitlines() == [
        "key,value", "optimizer.lr,0.1", "final/val/accuracy,0.75"]
    resumed = CsvSink(tmp_path, start_step=1)  # a run resumed from step 1 drops what came after it
    resumed.log(2, {"train/loss": 1.25})
    with open(tmp_path / "csv" / "metrics.csv", newline="") as file:
        assert [(row["step"], row["train/loss"]) for row in csv.DictReader(file)] == [("1", "2.0"), ("2", "1.25")]


def test_only_the_main_process_gets_sinks(tmp_path):
    """metrics.jsonl is kept whatever the list of sinks."""
    assert isinstance(make_logger(tmp_path, is_main=False, sinks={"tensorboard": TB}), NullLogger)
    assert list(tmp_path.iterdir()) == []
    real = make_logger(tmp_path, is_main=True, sinks={"csv": CSV})
    real.log(1, {"a": 1.0})
    real.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csv", "metrics.jsonl"]
    none = make_logger(tmp_path / "quiet", is_main=True, sinks={}, jsonl=False)
    none.log(1, {"a": 1.0})
    assert not (tmp_path / "quiet").exists()


def test_failed_sink_build_closes_earlier_sinks(tmp_path, monkeypatch):
    closed = []
    for sink in (JsonlSink, TensorBoardSink):
        monkeypatch.setattr(sink, "close", lambda self, close=sink.close: (closed.append(type(self).__name__),
                                                                            close(self)))
    broken = {**CSV, "no_such_argument": 1}
    with pytest.raises(Exception, match="no_such_argument"):  # the build's own error, not a closing one
        make_logger(tmp_path, is_main=True, sinks={"tensorboard": TB, "csv": broken})
    assert closed == ["JsonlSink", "TensorBoardSink"]


def test_truncated_metrics_file_is_read_and_resumed(tmp_path):
    """kill -9 while a row was being written leaves half a line: resuming drops it, the report skips it."""
    from runner.sweep.report import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "train/loss": 1.5}\n{"step": 20, "val/accuracy": 0.5}\n{"step": 30, "train/lo')
    assert read_metrics(path, "val/accuracy", "max")[:2] == ({"val/accuracy": 0.5}, 0.5)
    logger = JsonlSink(tmp_path, start_step=20)
    logger.log(30, {"train/loss": 1.0})
    logger.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 20, 30]


def test_full_disk_while_logging_names_the_file(tmp_path):
    """One DiskFull error, naming the file."""
    import errno

    from runner.errors import DiskFull

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = lambda self: None

    logger = JsonlSink(tmp_path)
    logger._file.close()
    logger._file = FullDisk()
    with pytest.raises(DiskFull, match=rf"no space left on the disk holding {tmp_path / 'metrics.jsonl'} while "
                                       r"writing metrics.jsonl at step 7"):
        logger.log(7, {"train/loss": 1.0})
    logger.close()  # after the error: closes what it can, raises nothing more


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="mlflow is installed")
def test_missing_mlflow_names_the_extra_to_install(tmp_path):
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        make_logger(tmp_path, is_main=True, sinks={"mlflow": {"_target_": "runner.loggers.MlflowSink",
                                                              "_partial_": True}}, jsonl=False)
    assert str(err.value) == ("bad config: logger.mlflow: needs the mlflow package, which is not installed; install it with "
                              "pip install 'mlflow>=2.10' (the 'mlflow' extra of runner-ml), or leave mlflow "
                              "out of logger=[...]")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline_records_the_whole_run(tmp_path, monkeypatch):
    """Name, tags, notes, config, scalars and summary."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    node = {"_target_": "runner.loggers.WandbSink", "_partial_": True, "project": "p", "mode": "offline"}
    logger = make_logger(tmp_path, is_main=True, sinks={"wandb": node}, jsonl=False,
                         run=RunInfo("probe", ("a", "b"), "some notes"))
    logger.log_config({"optimizer": {"lr": 0.1}})
    logger.log(1, {"train/loss": 2.0})
    logger.log(2, {"train/loss": 1.5})
    logger.log_final({}, {"val/accuracy": 0.75})
    run = logger.sinks[0]._run
    assert (run.name, tuple(run.tags), run.notes) == ("probe", ("a", "b"), "some notes")
    assert run.config["optimizer.lr"] == 0.1 and run.summary["final/val/accuracy"] == 0.75
    logger.close()
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
