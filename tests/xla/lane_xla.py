"""The checks of the XLA lane, run by tests/xla/check.sh in its own venv (torch and torch_xla of one version) with
PJRT_DEVICE=CPU, torch_xla's CPU device standing in for a TPU:

    python tests/xla/lane_xla.py a --work DIR   # python -m runner hardware=tpu, the default recipe end to end
    python tests/xla/lane_xla.py b --work DIR   # kill -9 mid-run, then resume=auto: bitwise the uninterrupted run
    python tests/xla/lane_xla.py c --work DIR   # runner.Accelerator in a hand-written loop on the XLA device
    python tests/xla/lane_xla.py d --work DIR   # precision=bf16 on the XLA device

Each part starts the runner as a user would (a fresh folder, `python -m runner ...`) and checks numbers and files.
A failed check prints what it compared and exits 1. Named lane_xla.py, not test_*.py: the main suite's torch has
no torch_xla, so `python -m pytest` must not collect it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUIET = ["trainer.progress_bar=false", "logger=[]"]


class LaneFailure(Exception):
    """A check of the lane failed; the message says what was compared."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise LaneFailure(message)


def say(message: str) -> None:
    print(f"[xla lane] {message}", flush=True)


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def runner(work: Path, overrides: list[str], timeout: float = 400) -> tuple[Path, str]:
    """`python -m runner OVERRIDES` in `work` (a fresh folder); returns its run dir and its console output."""
    work.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "runner", *overrides], cwd=work, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    check(done.returncode == 0, f"`python -m runner {' '.join(overrides)}` exited {done.returncode}:\n{tail(output)}")
    return run_dir_of(work), output


def run_dir_of(work: Path) -> Path:
    found = sorted(path.parent for path in work.glob("outputs/*/*/.hydra"))
    check(len(found) == 1, f"expected one run dir under {work}/outputs, found {[str(path) for path in found]}")
    return found[0]


def same_weights(got: Path, want: Path, what: str) -> None:
    """Every tensor of `got` bitwise equal to the one of the same name in `want`."""
    import torch
    from safetensors.torch import load_file

    check(got.is_file() and want.is_file(), f"{what}: missing {got if not got.is_file() else want}")
    a, b = load_file(got), load_file(want)
    check(a.keys() == b.keys(), f"{what}: tensor names differ: {sorted(a.keys() ^ b.keys())}")
    for name in sorted(a):
        if not torch.equal(a[name], b[name]):
            difference = (a[name].double() - b[name].double()).abs().max().item()
            raise LaneFailure(f"{what}: tensor {name!r} differs (max abs difference {difference:.3e})")
    say(f"{what}: {len(a)} tensors bitwise equal")


def part_a(work: Path) -> None:
    """The default recipe on the XLA device, as `python -m runner hardware=tpu` runs it: trains to the accuracy the
    CPU reaches, evaluates, checkpoints each epoch, exports, and the export loads back into the model on the CPU."""
    started = time.monotonic()
    run_dir, output = runner(work / "a", ["hardware=tpu", *QUIET])
    check("device xla:0" in output, f"the run does not say it trained on xla:0:\n{tail(output)}")
    result = json.loads((run_dir / "result.json").read_text())
    accuracy = result["final"]["val/accuracy"]
    # The CPU run of this recipe ends at 1.0000 (docs/getting-started.md); XLA's kernels round differently.
    check(accuracy >= 0.99, f"final val/accuracy {accuracy} on XLA, below the CPU's 1.0 by more than 0.01")
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").glob("step_*"))
    check(checkpoints == ["step_00000313", "step_00000626", "step_00000939"],
          f"expected a checkpoint per epoch (steps 313, 626, 939), found {checkpoints}")
    exports = sorted(path.name for path in (run_dir / "export").iterdir())
    for name in ("final.safetensors", "best.safetensors", "config.yaml"):
        check(name in exports, f"export/{name} missing; export/ holds {exports}")
    # The exported weights are plain CPU tensors the same model takes (load_model refuses a missing or extra name).
    import torch
    import yaml
    from safetensors.torch import load_model

    from runner.config.instantiate import build_model

    model = build_model(yaml.safe_load((run_dir / "export" / "config.yaml").read_text())["model"])
    missing, unexpected = load_model(model, str(run_dir / "export" / "final.safetensors"))
    check(not missing and not unexpected, f"export/final.safetensors: missing {missing}, unexpected {unexpected}")
    check(all(torch.isfinite(value).all() for value in model.state_dict().values()), "non-finite exported weights")
    say(f"part a: default recipe on xla:0, final val/accuracy {accuracy:.4f}, checkpoints {', '.join(checkpoints)}, "
        f"exports {', '.join(exports)} ({time.monotonic() - started:.0f} s)")


def part_b(work: Path) -> None:
    """kill -9 once the first checkpoint is sealed, then `resume=auto`: the final weights are bitwise those of the
    same run uninterrupted (XLA's CPU device computes deterministically, as the CPU does)."""
    # One run dir named in advance, as a requeued job has (docs/checkpoints.md): resume=auto looks there.
    overrides = ["hardware=tpu", "trainer.max_steps=300", "checkpoint.every_n_steps=50", "data.num_validation=256",
                 "hydra.run.dir=outputs/lane/run", *QUIET]
    reference, _ = runner(work / "b-reference", overrides)
    killed = work / "b-killed"
    killed.mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-m", "runner", *overrides], cwd=killed, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not list(killed.glob("outputs/*/*/checkpoints/latest")):
        if process.poll() is not None:  # its output is read only then: reading it earlier waits for its end
            raise LaneFailure(f"the run ended (exit {process.returncode}) before its first checkpoint:\n"
                              f"{tail(process.stdout.read())}")
        check(time.monotonic() < deadline, "no checkpoint within 300 s")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    run_dir = run_dir_of(killed)
    check(process.returncode == -signal.SIGKILL, f"the run was not killed (exit {process.returncode})")
    check(not (run_dir / "export" / "final.safetensors").exists(), "the run finished before it was killed")
    done = subprocess.run([sys.executable, "-m", "runner", *overrides, "resume=auto"], cwd=killed,
                          capture_output=True, text=True, timeout=400)
    output = done.stdout + done.stderr
    check(done.returncode == 0, f"resume=auto exited {done.returncode}:\n{tail(output)}")
    log = (run_dir / "runner.log").read_text()
    resumed = re.search(r"resum\w* .*step_0*(\d+)", log)
    check(resumed is not None, f"runner.log does not say where it resumed:\n{tail(log)}")
    say(f"part b: killed with SIGKILL after the checkpoint of step {resumed.group(1)}; resume=auto continued from it")
    same_weights(run_dir / "export" / "final.safetensors", reference / "export" / "final.safetensors",
                 "killed and resumed vs uninterrupted, on xla")


def part_c(work: Path) -> None:
    """tests/xla/handwritten_xla.py on the XLA device and on the CPU: the model and batches on xla:0, every
    optimizer step through torch_xla's, `gather` across the (one) replica, and the CPU's per-step losses."""
    work.mkdir(parents=True)
    results = {}
    for device in ("xla", "cpu"):
        out = work / f"{device}.json"
        done = subprocess.run([sys.executable, str(HERE / "handwritten_xla.py"), device, str(out)],
                              capture_output=True, text=True, timeout=300)
        check(done.returncode == 0, f"handwritten_xla.py {device} exited {done.returncode}:\n"
                                    f"{tail(done.stdout + done.stderr)}")
        results[device] = json.loads(out.read_text())
    xla, cpu = results["xla"], results["cpu"]
    check(xla["device"] == "xla:0" and xla["parameter_device"] == "xla:0" and xla["batch_devices"] == ["xla:0"],
          f"on XLA: accelerator.device {xla['device']}, parameters on {xla['parameter_device']}, batches on "
          f"{xla['batch_devices']}; expected xla:0 for all")
    steps = len(xla["losses"])
    check(xla["xla_optimizer_steps"] == steps, f"{xla['xla_optimizer_steps']} of {steps} optimizer steps went "
                                               "through torch_xla's xm.optimizer_step")
    check(xla["gathered"] == [0, 1, 2], f"gather on one replica returned {xla['gathered']}, expected [0, 1, 2]")
    check(xla["losses"][-1] < xla["losses"][0], f"the loss did not go down on XLA: {xla['losses']}")
    # float32 on both; XLA fuses and orders the few products of this 8-16-3 network differently from the CPU's
    # kernels: each loss may differ by some float32 roundings (eps 1.2e-7 times a loss near 1), far less than
    # one step of training changes it (~1e-2).
    worst = max(abs(a - b) for a, b in zip(xla["losses"], cpu["losses"]))
    check(worst <= 1e-5, f"per-step losses on XLA and CPU differ by up to {worst:.2e} (bound 1e-5)")
    say(f"part c: hand-written loop on xla:0, {steps} steps through xm.optimizer_step, losses within {worst:.1e} of "
        f"the CPU's, gather {xla['gathered']}")


def part_d(work: Path) -> None:
    """precision=bf16 on the XLA device: autocast bfloat16 there, training (the loss falls), finite weights, and
    the loss within bf16's reach of the fp32 run's."""
    overrides = ["hardware=tpu", "trainer.max_steps=200", "trainer.log_every_steps=50",
                 "trainer.eval_every_steps=200", "data.num_validation=256", *QUIET]
    losses = {}
    for precision in ("fp32", "bf16"):
        run_dir, output = runner(work / f"d-{precision}", [*overrides, f"precision={precision}"])
        if precision == "bf16":
            check("autocast bfloat16" in output, f"the bf16 run does not say autocast bfloat16:\n{tail(output)}")
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[precision] = [row["train/loss"] for row in logged if "train/loss" in row]
        check(all(math.isfinite(value) for value in losses[precision]), f"{precision}: {losses[precision]}")
    for precision, values in losses.items():
        check(values[-1] < values[0] - 0.1, f"{precision} on XLA did not train: train/loss {values}")
    # bf16 keeps 8 bits of mantissa (a relative rounding of 2^-9 = 0.2% per product); after 200 steps the two
    # runs' losses may drift apart by a few percent, not by what training moves them.
    gap = abs(losses["bf16"][-1] - losses["fp32"][-1]) / losses["fp32"][-1]
    check(gap < 0.1, f"bf16's final train/loss {losses['bf16'][-1]:.4f} is {gap:.1%} from fp32's "
                     f"{losses['fp32'][-1]:.4f}")
    say(f"part d: bf16 on xla:0 trained, train/loss {losses['bf16'][0]:.4f} -> {losses['bf16'][-1]:.4f} "
        f"(fp32: {losses['fp32'][0]:.4f} -> {losses['fp32'][-1]:.4f}, {gap:.2%} apart at the end)")


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--work", type=Path, required=True, help="a folder for the runs' outputs")
    args = parser.parse_args()
    if os.environ.get("PJRT_DEVICE") != "CPU":
        print("PJRT_DEVICE=CPU is not set: run this through tests/xla/check.sh", file=sys.stderr)
        return 2
    try:
        PARTS[args.part](args.work.resolve())
    except LaneFailure as failure:
        print(f"XLA lane part {args.part} FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
