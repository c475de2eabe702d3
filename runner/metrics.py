"""Where metrics go: TensorBoard, metrics.jsonl and the console progress bar.

Real objects on the main process, no-op objects elsewhere: the rank is decided here, once, so the loop never asks.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import yaml

from runner.errors import WriteError, write_failure


class MetricsLogger:
    """Scalars to TensorBoard (`<run dir>/tensorboard`) and one JSON object per logged step to metrics.jsonl."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, jsonl: bool = True, start_step: int = 0):
        """`start_step`: the step a resumed run continues after; what an interrupted run logged beyond it is
        dropped (TensorBoard's purge_step, and the later lines of metrics.jsonl), so no step appears twice."""
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            resumed = (run_dir / "tensorboard").is_dir()
            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                         purge_step=start_step + 1 if resumed else None)
        self._jsonl = None
        self._run_dir = run_dir
        self._failed = False  # a write failed (a full disk): close() then does what it can and says nothing
        if jsonl:
            path = run_dir / "metrics.jsonl"
            with write_failure(path, "metrics.jsonl"):
                _drop_rows_after(path, start_step)
                self._jsonl = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self._writer:
            # One event holding all of the step's scalars, not one event each: without TensorFlow, TensorBoard
            # checksums every event in pure Python on its writer thread, ~80 us of CPU per event.
            from tensorboard.compat.proto.summary_pb2 import Summary

            values = [Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()]
            with self._writing("tensorboard", f"TensorBoard events at step {step}"):
                self._writer.file_writer.add_summary(Summary(value=values), step)
        if self._jsonl:
            with self._writing("metrics.jsonl", f"metrics.jsonl at step {step}"):
                self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
                self._jsonl.flush()

    @contextmanager
    def _writing(self, name: str, what: str) -> Iterator[None]:
        try:
            with write_failure(self._run_dir / name, what):
                yield
        except WriteError:
            self._failed = True
            raise

    def log_config(self, config: dict[str, Any]) -> None:
        """The resolved config as text (TensorBoard's Text tab), in YAML inside a code block."""
        if self._writer:
            text = yaml.safe_dump(config, sort_keys=False)
            self._writer.add_text("config", "```\n" + text + "```", 0)

    def log_hparams(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        """Flattened config as hparams with the final metrics, so TensorBoard's HParams tab compares runs."""
        if self._writer:
            metrics = {f"hparam/{name}": value for name, value in final_metrics.items()}
            # run_name="." keeps them in this run's event file instead of a new timestamped subdirectory.
            self._writer.add_hparams(flatten_hparams(config), metrics, run_name=".")

    def close(self) -> None:
        """Flush and close; after a failed write (the error already raised) only what still can be."""
        failed_before = self._failed
        try:
            if self._writer:
                with self._writing("tensorboard", "TensorBoard events"):
                    self._writer.close()
            if self._jsonl:
                with self._writing("metrics.jsonl", "metrics.jsonl"):
                    self._jsonl.close()
        except WriteError:
            if not failed_before:
                raise


class NullLogger:
    """What processes other than the main one log to: nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def log_hparams(self, config: dict[str, Any], final_metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(run_dir: Path, is_main: bool, tensorboard: bool, jsonl: bool,
                start_step: int = 0) -> MetricsLogger | NullLogger:
    return MetricsLogger(run_dir, tensorboard, jsonl, start_step) if is_main else NullLogger()


def _drop_rows_after(path: Path, step: int) -> None:
    """Keep the rows up to `step` of an interrupted run's metrics.jsonl (rewritten atomically)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if (row := read_row(line)) is not None and row.get("step", 0) <= step]
    if len(kept) != len(lines):
        partial = path.with_name(f".partial-{path.name}")
        partial.write_text("".join(kept), encoding="utf-8")
        partial.replace(path)


def read_row(line: str) -> dict | None:
    """One metrics.jsonl row, or None for a blank line or one cut short (the run was killed while writing it)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def write_hparams_session(log_dir: Path, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
    """One HParams session (a row in TensorBoard's HParams tab) in its own directory, replacing what was there."""
    import shutil

    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    shutil.rmtree(log_dir, ignore_errors=True)  # a re-run job replaces its row instead of adding a second one
    # What add_hparams writes, but into this writer's one event file (add_hparams opens a second writer).
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for summary in hparams_summaries(flatten_hparams(hparams), metrics):
            writer.file_writer.add_summary(summary)
        for name, value in metrics.items():
            writer.add_scalar(name, value)


def flatten_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """Nested keys as dotted names; lists, None and other non-scalars as strings (TensorBoard refuses them)."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_hparams(value, prefix=f"{name}."))
        elif isinstance(value, Enum):
            flat[name] = str(value.value)
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


class Progress:
    """A tqdm bar over optimizer steps with loss and samples/s; nothing at all when disabled."""

    def __init__(self, total: int, enabled: bool):
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True)
            # Log lines go through tqdm.write while the bar is shown, so they do not tear the bar apart.
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()

    def update(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def show(self, metrics: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.set_postfix({name: _short(value) for name, value in metrics.items()}, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._redirect.__exit__(None, None, None)
            self._bar = None


def _short(value: float) -> str:
    if math.isfinite(value) and abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.4g}"
