"""What the console shows for the docs' first examples: the run's own lines, each once, and nothing from the
libraries (their warnings and progress bars go to the run's log, or nowhere), with one process and with two."""

from __future__ import annotations

import re

import pytest

from conftest import run_cli

# The head of each line the console shows, in order: `[time][logger][LEVEL] - ` stripped, cut at the first digit or
# colon, so the figures may move but no line may be added, doubled or lost. "  " is the model's table.
ONE_PROCESS = [
    "runner: run dir", "runner.run.wiring: model SeqTransformer", "  ", "  ", "  ", "  ",
    "runner.run.wiring: device cpu | precision fp", "runner.run.wiring: batch",
    "runner.config.instantiate: AdamW parameter groups",
    "runner.run.wiring: data", "runner.run.wiring: schedule", "runner.run.wiring: fast_dev_run",
    "runner.run.wiring: throughput", "runner.training.metrics: step", "runner.training.metrics: step", "runner.training.loop: step",
    "runner: final val/loss=", "runner: done in",
]
TWO_PROCESSES = [
    *ONE_PROCESS[:1], "runner.launch.launcher: launching", "runner.launch.worker: rank", *ONE_PROCESS[1:10],
    "runner.accelerate.parallel: fsdp", *ONE_PROCESS[10:],
]


def _heads(output: str) -> list[str]:
    heads = []
    for line in output.splitlines():
        logged = re.match(r"\[[\d\- :,]+\]\[([\w.]+)\]\[INFO\] - (.*)", line)
        if logged:
            name, message = logged.groups()
            head = re.split(r"[\d:]", message, maxsplit=1)[0].rstrip()
            heads.append(f"{name}: {head}")
        else:
            heads.append("  " if line.startswith("  ") else line)
    return heads


@pytest.mark.parametrize("processes, expected", [
    ([], ONE_PROCESS),
    (["hardware=multi_cpu", "hardware.num_processes=2", "parallel=fsdp"], TWO_PROCESSES),
], ids=["one process", "two processes, fsdp"])
def test_a_debug_run_prints_its_own_lines_once(tmp_path, processes, expected):
    result = run_cli("debug=fast", "trainer.progress_bar=false", *processes, cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert result.stderr == ""
    assert _heads(result.stdout) == expected, result.stdout
