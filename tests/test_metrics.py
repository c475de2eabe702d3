from __future__ import annotations

import json

from runner.config import PrecisionKind
from runner.metrics import MetricsLogger, NullLogger, flatten_hparams, make_logger
from conftest import read_jsonl, read_scalars


def test_flatten_hparams_makes_dotted_scalars():
    flat = flatten_hparams(
        {"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "scheduler": None, "precision": {"kind": PrecisionKind.bf16},
         "trainer": {"progress_bar": True, "max_steps": 3}}
    )
    assert flat == {
        "optimizer.lr": 0.1, "optimizer.betas": "[0.9, 0.99]", "scheduler": "None", "precision.kind": "bf16",
        "trainer.progress_bar": True, "trainer.max_steps": 3,
    }


def test_logger_writes_scalars_text_hparams_and_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = MetricsLogger(tmp_path)
    logger.log(1, {"train/loss": 2.0})
    logger.log(2, {"train/loss": 1.5, "val/accuracy": 0.5})
    logger.log_config({"model": {"_target_": "runner.models.MLP"}, "seed": 0})
    logger.log_hparams({"optimizer": {"lr": 0.1}, "gpu_ids": None}, {"val/accuracy": 0.5})
    logger.close()

    assert read_scalars(tmp_path, "train/loss") == [(1, 2.0), (2, 1.5)]
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.5, "val/accuracy": 0.5}
    ]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert "runner.models.MLP" in events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert read_scalars(tmp_path, "hparam/val/accuracy") == [(0, 0.5)]
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["optimizer.lr"].number_value == 0.1
    assert session.hparams["gpu_ids"].string_value == "None"


def test_only_the_main_process_gets_a_real_logger(tmp_path):
    assert isinstance(make_logger(tmp_path, is_main=False, tensorboard=True, jsonl=True), NullLogger)
    assert list(tmp_path.iterdir()) == []
    real = make_logger(tmp_path, is_main=True, tensorboard=False, jsonl=True)
    real.log(1, {"a": 1.0})
    real.close()
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_all_scalars_of_a_step_are_read_back(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=True, jsonl=True)
    logger.log(1, {"train/loss": 2.5, "train/lr": 0.001, "train/samples_per_s": 640.0})
    logger.log(2, {"train/loss": 1.5, "train/lr": 0.002, "train/samples_per_s": 650.0})
    logger.log(2, {"val/accuracy": 0.75})
    logger.close()
    assert read_scalars(tmp_path, "train/loss") == [(1, 2.5), (2, 1.5)]
    assert [step for step, _ in read_scalars(tmp_path, "train/lr")] == [1, 2]
    assert read_scalars(tmp_path, "train/samples_per_s") == [(1, 640.0), (2, 650.0)]
    assert read_scalars(tmp_path, "val/accuracy") == [(2, 0.75)]
    assert read_jsonl(tmp_path / "metrics.jsonl")[1] == {"step": 2, "train/loss": 1.5, "train/lr": 0.002,
                                                         "train/samples_per_s": 650.0}


def test_a_metrics_file_cut_short_by_a_kill_is_read_and_resumed_without_error(tmp_path):
    """kill -9 while a row was being written leaves half a line: resuming drops it, the report skips it."""
    from runner.metrics import MetricsLogger
    from runner.report import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "train/loss": 1.5}\n{"step": 20, "val/accuracy": 0.5}\n{"step": 30, "train/lo')
    assert read_metrics(path, "val/accuracy", "max")[:2] == ({"val/accuracy": 0.5}, 0.5)
    logger = MetricsLogger(tmp_path, tensorboard=False, jsonl=True, start_step=20)
    logger.log(30, {"train/loss": 1.0})
    logger.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 20, 30]


def test_a_full_disk_while_logging_is_one_disk_full_error_naming_the_file(tmp_path):
    import errno

    import pytest

    from runner.errors import DiskFull
    from runner.metrics import MetricsLogger

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = lambda self: None

    logger = MetricsLogger(tmp_path, tensorboard=False, jsonl=True)
    logger._jsonl.close()
    logger._jsonl = FullDisk()
    with pytest.raises(DiskFull, match=rf"no space left on the disk holding {tmp_path / 'metrics.jsonl'} while "
                                       r"writing metrics.jsonl at step 7"):
        logger.log(7, {"train/loss": 1.0})
    logger.close()  # after the error: closes what it can, raises nothing more
