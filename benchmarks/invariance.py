"""The same experiment on any hardware: the default recipe, unchanged, on 1, 2 and 4 CPU processes.

    python benchmarks/invariance.py            # the three full default runs (a few minutes on 2 cores)
    python benchmarks/invariance.py --quick    # 40 steps each

Each run is `python -m runner [hardware=multi_cpu hardware.num_processes=N]` in a fresh directory. Printed per run:
validation token accuracy, optimizer steps, wall time, and the largest difference of the final weights from the
1-process run's (the global batch is the same, so the weights agree within float summation order).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {1: ("hardware=cpu",), 2: ("hardware=multi_cpu",), 4: ("hardware=multi_cpu", "hardware.num_processes=4")}


def run(processes: int, extra: tuple[str, ...], folder: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runner", *RUNS[processes], "trainer.progress_bar=false",
                           "hydra.run.dir=run", *extra], cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [row for row in rows if "val/accuracy" in row][-1]
    return {"accuracy": final["val/accuracy"], "steps": final["step"], "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="40 steps per run instead of the recipe's budget")
    args = parser.parse_args(argv)
    extra = ("trainer.max_steps=40",) if args.quick else ()
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        results, weights = {}, {}
        for processes in RUNS:
            folder = Path(tmp) / str(processes)
            folder.mkdir()
            results[processes] = run(processes, extra, folder)
            weights[processes] = load_file(folder / "run" / "export" / "final.safetensors")
    print("| processes | val token accuracy | optimizer steps | wall time | max weight difference from 1 process |")
    print("|---:|---:|---:|---:|---:|")
    for processes, result in results.items():
        difference = max((weights[processes][name] - weights[1][name]).abs().max().item() for name in weights[1])
        print(f"| {processes} | {result['accuracy']:.4f} | {result['steps']} | {result['wall_s']:.0f} s | "
              f"{difference:.1e} |")


if __name__ == "__main__":
    main()
