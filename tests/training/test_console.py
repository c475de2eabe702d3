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


def test_a_terminal_gets_a_bar_and_a_log_file_gets_lines(tmp_path):
    """On a terminal (a pseudo-terminal here) the progress is a tqdm bar redrawn in place; written to a file or a
    pipe (a batch job's log, nohup) it is one log line per trainer.progress_every_s (0 here: every step), with no
    carriage return, so the file holds lines a person reads."""
    import fcntl
    import os
    import struct
    import subprocess
    import sys
    import termios

    from conftest import cli_env

    run = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=32", "trainer.max_steps=4",
           "trainer.log_every_steps=2", "checkpoint.enabled=false")
    terminal, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a real terminal has a size
    with subprocess.Popen([sys.executable, "-m", "runner", *run], cwd=tmp_path, env=cli_env(), stdin=child,
                          stdout=child, stderr=child) as process:
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(terminal, 1 << 16)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
    os.close(terminal)
    shown = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, shown[-3000:]
    assert re.search(r"\rtrain: 100%\|[^\n]*\| 4/4 ", shown), shown[-3000:]
    assert "train: step" not in shown

    logged = run_cli(*run, "trainer.progress_every_s=0", cwd=tmp_path)
    assert logged.returncode == 0, logged.output
    assert "\r" not in logged.output and "it/s" not in logged.output and "step/s" not in logged.output
    lines = [line.split(" - ", 1)[1] for line in logged.stdout.splitlines() if "[runner.training.metrics]" in line
             and "train: step" in line]
    assert [line.split(",")[0] for line in lines] == [f"train: step {step}/4 ({25 * step}%)" for step in (1, 2, 3, 4)]
    assert "loss=" not in lines[1] and re.search(r", loss=[\d.]+, samples/s=\d+, 0:0\d elapsed", lines[2]), lines
    assert re.search(r"elapsed, about 0:0\d left$", lines[0]) and lines[3].endswith("elapsed"), lines


def test_a_resumed_runs_progress_line_counts_its_own_steps_in_the_rate(caplog, monkeypatch):
    """A run resumed at step 4 of 10 starts its line there; the time left comes from the steps this run took."""
    import logging

    from runner.training import metrics

    clock = iter([100.0, 100.0, 103.0])  # start; the first step 3 s later... (monotonic reads, in order)
    monkeypatch.setattr(metrics.time, "monotonic", lambda: next(clock))
    progress = metrics.Progress(10, enabled=True, line_every_s=0, terminal=False)
    progress.start(4)
    progress.show({"loss": 1.23456, "samples/s": 4321.7})
    with caplog.at_level(logging.INFO, logger="runner.training.metrics"):
        progress.update()
    assert caplog.messages == ["train: step 5/10 (50%), loss=1.235, samples/s=4322, 0:03 elapsed, about 0:15 left"]
    progress.close()
