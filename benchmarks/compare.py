"""One table: the plain PyTorch loop, the runner, HuggingFace Accelerate and Lightning Fabric on the same work, in the
same run. Each row comes from the benchmark that owns it, with that benchmark's interleaving and pairing:

    python benchmarks/compare.py            # about 6 minutes on 2 cores
    python benchmarks/compare.py --quick    # a few minutes, noisier

- per-step overhead and steps/s: benchmarks/overhead.py's loop arms (tiny Linear, small MLP), CPU time;
- start-up: benchmarks/overhead.py's start-up section (the raw script, alone and on each framework; the CLI);
- 2 processes: benchmarks/distributed.py (torchrun + the plain DDP script, the script on Accelerate and on Fabric,
  and `python -m runner hardware=multi_cpu`);
- checkpoint save/load: benchmarks/checkpoint.py (a model with its AdamW state).

Cells read median [min .. max] over the pairs or rounds; a ratio is to the plain arm of the same pair. Arms whose
package is missing (`pip install -e '.[bench]'`) are marked "not installed".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' own modules, when loaded by path
import alternatives  # noqa: E402
import checkpoint  # noqa: E402
import distributed  # noqa: E402
import overhead  # noqa: E402
from overhead import _range  # noqa: E402

COLUMNS = ("plain", "runner", "accelerate", "fabric")


def measure(pairs: int, steps_scale: float, rounds: int, startup_pairs: int, dist_rounds: int, dist_steps: int,
            params: int, repeats: int, arms: tuple[str, ...] = alternatives.ARMS) -> dict:
    loops = overhead.run_benchmark(("mlp", "tiny", "startup"), pairs, steps_scale, startup_pairs, rounds, arms)
    two = distributed.measure(dist_rounds, arms, extra_startup=False, steps=dist_steps)
    # Last: writing GiBs of checkpoints can push the libraries out of the page cache, and a start-up that reads them
    # back from disk measures the disk.
    with tempfile.TemporaryDirectory() as tmp:
        saves = checkpoint.measure(params, repeats, Path(tmp), arms)
    return {
        **loops,
        "distributed": two,
        "checkpoint": saves,
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end",
    }


def table(results: dict) -> str:
    """The README's table: one row per measure, one column per arm."""
    rows: list[tuple[str, dict[str, str]]] = []
    tiny, mlp = results["tiny"], results["mlp"]
    rows.append((f"per-step time, {tiny['workload']} (CPU ms/step; others: added over plain)", {
        arm: f"{stats['cpu_ms']['median']:.3f} ms" if arm == "plain" else _range(stats["cpu_overhead_ms"], "+.3f")
        for arm, stats in tiny["arms"].items()}))
    rows.append((f"steps/s, {mlp['workload']} (CPU; others: x plain)", {
        arm: f"{1e3 / stats['cpu_ms']['median']:.0f} steps/s" if arm == "plain" else _range(stats["cpu_ratio"], ".3f")
        for arm, stats in mlp["arms"].items()}))
    start = results["startup"]
    rows.append(("start-up of a script to its first step, s (runner: on runner.Accelerator)", {
        "plain": _range(start["plain_s"], ".2f"),
        **{arm: f"{_range(stats['s'], '.2f')}, {stats['ratio']['median']:.3f}x"
           for arm, stats in start["script_on"].items()}}))
    rows.append(("start-up of `python -m runner`, s (plain: the script importing the same libraries)", {
        "plain": _range(start["plain_with_libraries_s"], ".2f"),
        "runner": f"{_range(start['runner_s'], '.2f')}, {_range(start['added_own_s'], '+.2f')} s"}))
    rows.append(("stopping: last write to process exit, s (plain: that script, after its first step)", {
        "plain": _range(start["plain_with_libraries_exit_s"], ".2f"), "runner": _range(start["runner_exit_s"], ".2f")}))
    two = results["distributed"]["arms"]
    rows.append(("2 processes, steps/s, reverse-digits Transformer (others: x plain DDP under torchrun)", {
        arm: f"{stats['steps_per_s']['median']:.1f} steps/s" if arm == "plain" else _range(stats["ratio"], ".3f")
        for arm, stats in two.items()}))
    rows.append(("2 processes, command to first step, s (plain: torchrun + the script)", {
        arm: _range(stats["first_step_s"], ".2f") for arm, stats in two.items()}))
    saves = results["checkpoint"]
    size = f"{saves['params'] / 1e6:.0f}M parameters + AdamW"

    def seconds(key: str) -> str:
        values = saves["times"][key]["values"]
        return f"{saves['times'][key]['median']:.2f} [{min(values):.2f} .. {max(values):.2f}]"

    arms_saved = {key.split()[0] for key in saves["times"]}
    rows.append((f"checkpoint save, s, {size} (runner: training blocked; until sealed)", {
        arm: seconds(f"{arm} save") + (f"; {seconds('runner save until sealed')}" if arm == "runner" else "")
        for arm in COLUMNS if arm in arms_saved}))
    rows.append(("checkpoint load, s (runner: sha256-verified; verify=false)", {
        arm: seconds(f"{arm} load") + (f"; {seconds('runner load, verify=false')}" if arm == "runner" else "")
        for arm in COLUMNS if arm in arms_saved}))
    header = "| | " + " | ".join(alternatives.LABELS[arm] for arm in COLUMNS) + " |"
    lines = [header, "|---|" + "---|" * len(COLUMNS)]
    for label, cells in rows:
        lines.append(f"| {label} | " + " | ".join(cells.get(arm, cell_note(arm)) for arm in COLUMNS) + " |")
    return "\n".join(lines)


def cell_note(arm: str) -> str:
    return "not installed" if not alternatives.installed(arm) else "—"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer pairs, steps and rounds, a 20M-parameter model")
    parser.add_argument("--arms", default=",".join(alternatives.ARMS),
                        help=f"comma-separated subset of {','.join(alternatives.ARMS)} (plain is always measured)")
    parser.add_argument("--json", type=Path, help="also write the raw figures to this file")
    args = parser.parse_args(argv)
    arms = overhead.parse_names(parser, "--arms", args.arms, alternatives.ARMS)
    settings = (dict(pairs=2, steps_scale=0.25, rounds=4, startup_pairs=1, dist_rounds=1, dist_steps=30, params=20,
                     repeats=2) if args.quick else
                dict(pairs=3, steps_scale=1.0, rounds=10, startup_pairs=3, dist_rounds=2, dist_steps=60, params=100,
                     repeats=3))
    results = measure(**settings, arms=arms)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(overhead.report(results, settings["pairs"]))
    print(distributed.report(results["distributed"], settings["dist_rounds"], results["machine"]))
    print(checkpoint.report(results["checkpoint"]))
    print(f"\n{results['machine']}; torch threads: 1 per process in the loops and 2-process rows\n")
    print(table(results))


if __name__ == "__main__":
    main()
