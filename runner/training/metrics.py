"""What the sinks share (metrics.jsonl rows, flattened hparams, the sweep's HParams session) and the console
progress bar. The sinks themselves are in runner/training/loggers.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from runner.ground import flatten_hparams


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
