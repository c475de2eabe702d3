"""What the sinks share (metrics.jsonl rows, flattened hparams, the sweep's HParams session) and the console's
progress (a bar on a terminal, timed lines elsewhere). The sinks themselves are in runner/training/loggers.py."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from runner.config import TrainerConfig
from runner.ground import flatten_hparams

log = logging.getLogger(__name__)


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
    """The run's progress over optimizer steps, with loss and samples/s, on the console of the process that shows
    it. On a terminal (or in a notebook), a tqdm bar. Where stderr is not a terminal (a batch job's log file,
    nohup, a pipe), a bar would add each of its redraws (about ten a second) to the file; there, one log line with
    the same figures every `line_every_s` seconds instead. Nothing at all when disabled. Which of the three is
    decided once, here: each call below goes straight to it."""

    def __init__(self, total: int, enabled: bool, line_every_s: float = TrainerConfig.progress_every_s,
                 terminal: bool | None = None):
        if not enabled:
            self._shown = _Nothing()
        elif _draws_bars() if terminal is None else terminal:
            self._shown = _Bar(total)
        else:
            self._shown = _Lines(total, line_every_s)

    def start(self, step: int) -> None:
        """The step the run starts from (a resumed run's): counted as done, not in the rate."""
        self._shown.start(step)

    def update(self, steps: int = 1) -> None:
        self._shown.update(steps)

    def show(self, metrics: dict[str, float]) -> None:
        self._shown.show({name: _short(value) for name, value in metrics.items()})

    def close(self) -> None:
        self._shown.close()
        self._shown = _Nothing()


def _draws_bars() -> bool:
    """A terminal, or a Jupyter kernel's output (where tqdm.auto draws a widget)."""
    return sys.stderr.isatty() or type(sys.stderr).__module__.startswith("ipykernel")


class _Nothing:
    def start(self, step: int) -> None:
        pass

    def update(self, steps: int) -> None:
        pass

    def show(self, shown: dict[str, str]) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar(_Nothing):
    def __init__(self, total: int):
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True)
        # Log lines go through tqdm.write while the bar is shown, so they do not tear the bar apart.
        self.redirect = logging_redirect_tqdm()
        self.redirect.__enter__()

    def start(self, step: int) -> None:
        self.bar.update(step)

    def update(self, steps: int) -> None:
        self.bar.update(steps)

    def show(self, shown: dict[str, str]) -> None:
        self.bar.set_postfix(shown, refresh=False)

    def close(self) -> None:
        self.bar.close()
        self.redirect.__exit__(None, None, None)


class _Lines(_Nothing):
    """`train: step 1200/5000 (24%), loss=1.933, samples/s=5756, 2:31 elapsed, about 8:02 left`, logged at most
    every `every_s` seconds. One clock read per step."""

    def __init__(self, total: int, every_s: float):
        self.total, self.every_s = total, every_s
        self.shown: dict[str, str] = {}
        self.start(0)

    def start(self, step: int) -> None:
        self.done = self.first = step
        self.started = self.written = time.monotonic()

    def update(self, steps: int) -> None:
        self.done += steps
        now = time.monotonic()
        if now - self.written >= self.every_s:
            self.written = now
            log.info("%s", self.line(now - self.started))

    def show(self, shown: dict[str, str]) -> None:
        self.shown = shown

    def line(self, elapsed: float) -> str:
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        parts = [f"train: step {self.done}/{self.total}{share}",
                 *(f"{name}={value}" for name, value in self.shown.items()), f"{_clock(elapsed)} elapsed"]
        if elapsed > 0 and self.total > self.done > self.first:
            parts.append(f"about {_clock((self.total - self.done) * elapsed / (self.done - self.first))} left")
        return ", ".join(parts)


def _clock(seconds: float) -> str:
    """2:31, or 1:02:31."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _short(value: float) -> str:
    if math.isfinite(value) and abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.4g}"
