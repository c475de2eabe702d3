"""Multi-process cost of the runner against plain PyTorch DDP started by torchrun, and against the same script on
HuggingFace Accelerate and Lightning Fabric, measured in the same run.

    python benchmarks/distributed.py               # 3 interleaved rounds (about 10 minutes on 2 busy cores)
    python benchmarks/distributed.py --rounds 1    # a quick look

1. Throughput: 2 gloo processes train the runner's default workload (reverse 12 digits, small Transformer, AdamW,
   batch 32 per process) for 60 steps: `python -m runner hardware=multi_cpu` against benchmarks/plain_ddp.py under
   `torchrun --nproc_per_node 2`, by hand (DDP) and with `--framework accelerate|fabric` (what a user would pick
   instead; skipped with a note where the bench extra is not installed), interleaved A B C D, B C D A, .... Steps/s come
   from the logging windows after the first (every arm reads the loss once per 10-step window); each arm's ratio is
   to the plain arm of the same round. Because wall time on a shared machine moves with other people's jobs, the
   workers' CPU seconds per step (user + system, all threads, read from /proc between the first and the last
   window) are compared too: that ratio is what each arm itself costs. Every script arm checks that its two
   replicas end with equal weights, so each really trained one data-parallel model.
2. Start-up: seconds from the command to the end of the first optimizer step (every arm writes a file then; this
   script polls for it), for each arm at 2 processes, plus the runner at 1 process and with spawn against torchrun
   + the plain script. The dataset is generated and cached by a warm-up run first, so this is launch cost only.

Every arm runs one torch thread per process (torchrun sets OMP_NUM_THREADS=1; the runner gives each of N workers
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' own modules, when loaded by path
import alternatives  # noqa: E402
from overhead import _range, caching_bytecode, parse_names, spread  # noqa: E402

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


def run(command: list[str], out: Path, first_step_done, progress=None,
        steps: int = STEPS) -> tuple[float, float | None]:
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
            if windows in (1, steps // LOG_EVERY) and windows not in cpu_marks and len(pids) == 2:
                cpu_marks[windows] = cpu_seconds(pids)
        time.sleep(0.01)
    output = process.stdout.read()
    if process.returncode != 0 or first_step is None and not first_step_done(out):
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{output[-3000:]}")
    first_step = first_step if first_step is not None else time.perf_counter() - started
    if progress is None:
        return first_step, None
    return first_step, (cpu_marks[steps // LOG_EVERY] - cpu_marks[1]) / (steps - LOG_EVERY)


def runner_steps_per_s(out: Path, processes: int) -> float:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in line]
    windows = [row["train/samples_per_s"] / (BATCH * processes) for row in rows]
    return statistics.mean(windows[1:])  # the first window holds the warm-up steps


def plain_steps_per_s(out: Path) -> float:
    return statistics.mean(json.loads((out / "result.json").read_text())["steps_per_s"][1:])


def framework_command(out: Path, processes: int, steps: int, log_every: int, framework: str) -> list[str]:
    return [*plain_command(out, processes, steps, log_every), "--framework", framework]


# Each arm at 2 processes: (command for (out, steps, log_every), first step done?, progress, steps/s read-back).
def arms_at_two(start_method: str = "auto") -> dict:
    plain = (plain_first_step, plain_progress, plain_steps_per_s)
    return {
        "plain": (lambda out, steps, every: plain_command(out, 2, steps, every), *plain),
        "runner": (lambda out, steps, every: runner_command(out, 2, start_method, steps, every), runner_first_step,
                   runner_progress, lambda out: runner_steps_per_s(out, 2)),
        **{framework: (lambda out, steps, every, framework=framework:
                       framework_command(out, 2, steps, every, framework), *plain)
           for framework in alternatives.FRAMEWORKS},
    }


# Start-up only: what the start method and the process count cost the runner, against torchrun + the plain script.
EXTRA_STARTUP = {
    "runner, 1 process": lambda out: (runner_command(out, 1, "auto", 1, 1), runner_first_step),
    "torchrun + plain, 1 process": lambda out: (plain_command(out, 1, 1, 1), plain_first_step),
    "runner, 2 processes, spawn": lambda out: (runner_command(out, 2, "spawn", 1, 1), runner_first_step),
}


def measure(rounds: int, arms: tuple[str, ...] = alternatives.ARMS, extra_startup: bool = True,
            steps: int = STEPS, warmup: bool = True, separate_start: bool = True) -> dict:
    """Every arm's 2-process steps/s, worker CPU seconds per step and seconds to its first optimizer step, the arms
    interleaved round by round; each arm's ratios are to the plain arm of the same round.

    warmup=False skips the unmeasured warm-up launches (the first runner run then generates the data), and
    separate_start=False reads the first step's time from the throughput run instead of a 1-step launch: each arm
    launched once a round, for a smoke test (the start-up figures then include data generation and warming)."""
    measured = ["plain", *(arm for arm in alternatives.available(arms) if arm != "plain")]
    two = arms_at_two()
    rates = {arm: [] for arm in measured}
    cpu = {arm: [] for arm in measured}
    first_step = {arm: [] for arm in measured}
    startup = {name: [] for name in EXTRA_STARTUP} if extra_startup else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        uncached = set(os.environ) - set(caching_bytecode(dict(os.environ)))  # what keeps bytecode from caching
        saved = {key: os.environ.get(key) for key in ("HF_DATASETS_CACHE", "PYTHONPATH", *uncached)}
        for key in uncached:
            del os.environ[key]
        os.environ["HF_DATASETS_CACHE"] = str(work / "hf")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        try:
            if warmup:
                run(runner_command(work / "warmup", 2, "auto", 1, 1), work / "warmup", runner_first_step)  # the data
                for arm in measured[2:]:  # and the frameworks' files in the OS cache
                    command, done = two[arm][0](work / f"warmup-{arm}", 1, 1), two[arm][1]
                    run(command, work / f"warmup-{arm}", done)
            for index in range(rounds):
                for arm in alternatives.interleaved(measured, index):
                    command, done, progress, read_rate = two[arm]
                    out = work / f"tp-{arm}-{index}"
                    started, cpu_per_step = run(command(out, steps, LOG_EVERY), out, done, progress, steps)
                    rates[arm].append(read_rate(out))
                    cpu[arm].append(cpu_per_step)
                    if not separate_start:
                        first_step[arm].append(started)
                    if arm != "runner":
                        assert json.loads((out / "result.json").read_text())["replicas_equal"], arm
                for arm in alternatives.interleaved(measured, index + 1) if separate_start else ():
                    command, done = two[arm][0], two[arm][1]
                    out = work / f"start-{arm}-{index}"
                    first_step[arm].append(run(command(out, 1, 1), out, done)[0])
                for name, arm in (EXTRA_STARTUP.items() if extra_startup else ()):
                    out = work / f"start-{list(EXTRA_STARTUP).index(name)}-{index}"
                    command, done = arm(out)
                    startup[name].append(run(command, out, done)[0])
                print(f"round {index + 1}/{rounds}: " + ", ".join(
                    f"{arm} {rates[arm][-1]:.1f} steps/s, first step {first_step[arm][-1]:.2f} s" for arm in measured),
                    flush=True)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return {
        "steps": steps,
        "arms": {arm: {
            "steps_per_s": spread(rates[arm]),
            "ratio": spread([rate / plain for rate, plain in zip(rates[arm], rates["plain"])]),
            "cpu_ratio": spread([plain / own for own, plain in zip(cpu[arm], cpu["plain"])]),
            "first_step_s": spread(first_step[arm]),
        } for arm in measured},
        "startup": {name: spread(values) for name, values in startup.items()},
        "missing": [alternatives.missing_note(arm) for arm in arms if not alternatives.installed(arm)],
    }


LABELS = {"plain": "plain DDP script, torchrun", "runner": "runner, hardware=multi_cpu",
          "accelerate": "the script on Accelerate, torchrun", "fabric": "the script on Fabric, torchrun"}


def report(results: dict, rounds: int, env_note: str) -> str:
    out = [f"2 gloo processes, {results['steps']} steps of the default workload | {rounds} interleaved rounds, "
           f"median [min .. max] | {env_note}",
           f"  {'arm':36} {'steps/s':>8} {'x plain (wall)':>24} {'x plain (worker CPU)':>24} "
           f"{'first step s':>24}"]
    for arm, row in results["arms"].items():
        out.append(f"  {LABELS[arm]:36} {row['steps_per_s']['median']:8.1f} {_range(row['ratio'], '.3f'):>24} "
                   f"{_range(row['cpu_ratio'], '.3f'):>24} {_range(row['first_step_s'], '.2f'):>24}")
    out += [f"  {note}" for note in results["missing"]]
    for name, stats in results["startup"].items():
        out.append(f"  {name:36} {'':8} {'':24} {'':24} {_range(stats, '.2f'):>24}")
    runner, plain = results["arms"]["runner"], results["arms"]["plain"]
    ratio = runner["ratio"]["median"]
    out.append(f"{'PASS' if ratio >= 0.97 else 'MISS'} 2-process throughput: runner at "
               f"{_range(runner['ratio'], '.3f')}x plain DDP under torchrun (target >= 0.97x)")
    later = runner["first_step_s"]["median"] - plain["first_step_s"]["median"]
    out.append(f"{'PASS' if later <= 0 else 'MISS'} 2-process start: runner's first step {later:+.2f} s after "
               "torchrun + the plain script's, median (target: no later)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per throughput run (default {STEPS})")
    parser.add_argument("--arms", default=",".join(alternatives.ARMS),
                        help=f"comma-separated subset of {','.join(alternatives.ARMS)} (plain is always measured)")
    args = parser.parse_args(argv)
    arms = parse_names(parser, "--arms", args.arms, alternatives.ARMS)
    env_note = f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"
    print(report(measure(args.rounds, arms, steps=args.steps), args.rounds, env_note))


if __name__ == "__main__":
    main()
