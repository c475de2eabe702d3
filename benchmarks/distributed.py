"""Multi-process cost of the runner against plain PyTorch DDP started by torchrun, measured in the same run.

    python benchmarks/distributed.py               # 3 alternating rounds (about 10 minutes on 2 busy cores)
    python benchmarks/distributed.py --rounds 1    # a quick look

1. Throughput: 2 gloo processes train the runner's default workload (reverse 12 digits, small Transformer, AdamW,
   batch 32 per process) for 60 steps: `python -m runner hardware=multi_cpu` against benchmarks/plain_ddp.py under
   `torchrun --nproc_per_node 2`, alternating A B A B. Steps/s come from the logging windows after the first (both
   read the loss once per 10-step window); the ratio is runner / plain per round. Because wall time on a shared
   machine moves with other people's jobs, the workers' CPU seconds per step (user + system, all threads, read from
   /proc between the first and the last window) are compared too: that ratio is what the runner itself costs.
2. Start-up: seconds from the command to the end of the first optimizer step (both write a file then; this script
   polls for it), for 1 and 2 processes, the runner with each start method against torchrun + the plain script,
   all alternating. The dataset is generated and cached by a warm-up run first, so this is launch cost only.

Both arms run one torch thread per process (torchrun sets OMP_NUM_THREADS=1; the runner gives each of N workers
cores // N). On a machine shared with other jobs the absolute numbers drift; the per-round ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, ROWS, STEPS, LOG_EVERY = 32, 4096, 60, 10


def runner_command(out: Path, processes: int, start_method: str, steps: int, log_every: int) -> list[str]:
    hardware = ["hardware=cpu"] if processes == 1 else [
        "hardware=multi_cpu", f"hardware.num_processes={processes}", f"hardware.start_method={start_method}"]
    return [sys.executable, "-m", "runner", *hardware, f"data.num_train={ROWS}",
            # trainer.batch_size is global: BATCH per process, like the plain script's --batch-size.
            "data.num_validation=64", f"trainer.batch_size={BATCH * processes}", f"trainer.max_steps={steps}",
            "trainer.max_epochs=100", f"trainer.log_every_steps={log_every}", "trainer.progress_bar=false",
            "checkpoint.enabled=false", f"hydra.run.dir={out}"]


def plain_command(out: Path, processes: int, steps: int, log_every: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            str(ROOT / "benchmarks" / "plain_ddp.py"), "--out", str(out), "--steps", str(steps),
            "--log-every", str(log_every), "--batch-size", str(BATCH), "--rows", str(ROWS)]


def runner_first_step(out: Path) -> bool:
    metrics = out / "metrics.jsonl"
    return metrics.is_file() and "train/loss" in metrics.read_text()


def plain_first_step(out: Path) -> bool:
    return (out / "first_step").is_file()


_WORKER_PIDS: dict[Path, list[int]] = {}


def runner_progress(out: Path) -> tuple[int, list[int]]:
    """(logging windows done, worker PIDs) of a runner run. The PIDs are read from the rank logs once: re-reading
    growing logs every 10 ms took CPU from the runner's workers (the plain arm's pid files are a few bytes)."""
    metrics = out / "metrics.jsonl"
    windows = metrics.read_text().count("train/loss") if metrics.is_file() else 0
    if len(_WORKER_PIDS.get(out, ())) < 2:
        logs = [log.read_text() for log in out.glob("runner_rank*.log")]
        _WORKER_PIDS[out] = [int(match) for text in logs for match in re.findall(r", pid (\d+),", text)]
    return windows, _WORKER_PIDS[out]


def plain_progress(out: Path) -> tuple[int, list[int]]:
    progress = out / "progress"
    windows = len(progress.read_text().split()) if progress.is_file() else 0
    return windows, [int(path.read_text()) for path in out.glob("pid_*")]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time so far of these processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def run(command: list[str], out: Path, first_step_done, progress=None) -> tuple[float, float | None]:
    """Run a command to its end: (seconds from its start to its first optimizer step, worker CPU seconds per
    step between the end of the first and of the last logging window, when `progress` is given)."""
    out.mkdir(parents=True, exist_ok=True)
    started, first_step, cpu_marks = time.perf_counter(), None, {}
    process = subprocess.Popen(command, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while process.poll() is None:
        if first_step is None and first_step_done(out):
            first_step = time.perf_counter() - started
        if progress is not None:
            windows, pids = progress(out)
            if windows in (1, STEPS // LOG_EVERY) and windows not in cpu_marks and len(pids) == 2:
                cpu_marks[windows] = cpu_seconds(pids)
        time.sleep(0.01)
    output = process.stdout.read()
    if process.returncode != 0 or first_step is None and not first_step_done(out):
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{output[-3000:]}")
    first_step = first_step if first_step is not None else time.perf_counter() - started
    if progress is None:
        return first_step, None
    return first_step, (cpu_marks[STEPS // LOG_EVERY] - cpu_marks[1]) / (STEPS - LOG_EVERY)


def runner_steps_per_s(out: Path, processes: int) -> float:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in line]
    windows = [row["train/samples_per_s"] / (BATCH * processes) for row in rows]
    return statistics.mean(windows[1:])  # the first window holds the warm-up steps


def plain_steps_per_s(out: Path) -> float:
    return statistics.mean(json.loads((out / "result.json").read_text())["steps_per_s"][1:])


def throughput_round(work: Path, index: int) -> tuple[float, float, float, float]:
    """(runner steps/s, plain steps/s, runner CPU s/step, plain CPU s/step) of one alternating pair."""
    runner_out, plain_out = work / f"tp-runner-{index}", work / f"tp-plain-{index}"
    _, runner_cpu = run(runner_command(runner_out, 2, "spawn", STEPS, LOG_EVERY), runner_out, runner_first_step,
                        runner_progress)
    _, plain_cpu = run(plain_command(plain_out, 2, STEPS, LOG_EVERY), plain_out, plain_first_step, plain_progress)
    return runner_steps_per_s(runner_out, 2), plain_steps_per_s(plain_out), runner_cpu, plain_cpu


STARTUP_ARMS = {
    "runner, 1 process": lambda out: (runner_command(out, 1, "spawn", 1, 1), runner_first_step),
    "torchrun + plain, 1 process": lambda out: (plain_command(out, 1, 1, 1), plain_first_step),
    "runner, 2 processes (spawn)": lambda out: (runner_command(out, 2, "spawn", 1, 1), runner_first_step),
    "runner, 2 processes (fork)": lambda out: (runner_command(out, 2, "fork", 1, 1), runner_first_step),
    "torchrun + plain, 2 processes": lambda out: (plain_command(out, 2, 1, 1), plain_first_step),
}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env_note = f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(work / "hf")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        run(runner_command(work / "warmup", 2, "fork", 1, 1), work / "warmup", runner_first_step)  # caches the data

        rates: dict[str, list[float]] = {"runner": [], "plain": [], "ratio": [], "cpu ratio": []}
        startup: dict[str, list[float]] = {name: [] for name in STARTUP_ARMS}
        for index in range(args.rounds):
            runner_rate, plain_rate, runner_cpu, plain_cpu = throughput_round(work, index)
            rates["runner"].append(runner_rate)
            rates["plain"].append(plain_rate)
            rates["ratio"].append(runner_rate / plain_rate)
            rates["cpu ratio"].append(plain_cpu / runner_cpu)  # CPU seconds per step: plain / runner
            for name, arm in STARTUP_ARMS.items():
                out = work / f"start-{index}-{list(STARTUP_ARMS).index(name)}"
                command, done = arm(out)
                startup[name].append(run(command, out, done)[0])
            print(f"round {index + 1}/{args.rounds}: runner {runner_rate:.2f} steps/s, plain DDP {plain_rate:.2f} "
                  f"steps/s, ratio {rates['ratio'][-1]:.3f}; CPU s/step runner {runner_cpu:.4f}, plain "
                  f"{plain_cpu:.4f}, ratio {rates['cpu ratio'][-1]:.3f}", flush=True)

    print(f"\n## 2-process gloo throughput ({args.rounds} alternating rounds; {env_note})")
    print(f"runner (python -m runner hardware=multi_cpu): {summary(rates['runner'])} steps/s")
    print(f"plain DDP under torchrun:                    {summary(rates['plain'])} steps/s")
    print(f"ratio runner / plain, wall-clock steps/s:    {summary(rates['ratio'])}  (target >= 0.97)")
    print(f"ratio by CPU time per step (plain / runner): {summary(rates['cpu ratio'])}  (steadier on a shared machine)")
    print("\n## Seconds from the command to the end of the first optimizer step (median, min-max)")
    for name, values in startup.items():
        print(f"{name:32s} {summary(values)}")


if __name__ == "__main__":
    main()
