"""Checkpoint save/load time of a ~100M-parameter model with its AdamW state, against plain torch.save/torch.load
of the same dicts and against Accelerate and Fabric, measured in the same process, interleaved (A B C D, B C D A).

    python benchmarks/checkpoint.py [--params 100] [--repeats 3] [--dir /tmp/ckpt-bench] [--arms plain,runner]
    python benchmarks/checkpoint.py --finite-check [--params 100] [--repeats 5]
    python benchmarks/checkpoint.py --object-storage moto|s3://bucket/prefix [--params 100] [--repeats 3]

--object-storage measures the runner's save until committed to object storage (checkpoint.dir: sealed on disk,
uploaded, manifest last) and its load fetched from there (download, sha256 verified, loaded), beside the same on
local disk, interleaved, with the bytes per second. `moto` starts moto's S3 server on 127.0.0.1 (the test extra
installs it); an s3:// URL uses the environment's credentials and endpoint (AWS_*).

--finite-check measures only what the check for NaN/inf in the weights and optimizer state (done before every
save) costs: the runner's save with and without it, interleaved, and the check alone.

"runner" save = safetensors weights + torch.save of optimizer/RNG/loop state into a partial directory: the time the
training loop is blocked. "until sealed" adds what a background thread then does while training goes on: every
file hashed (sha256 per 64 MiB block) and fsynced, manifest written last, directory renamed, `latest` moved.
"plain" save = one torch.save({"model":..., "optimizer":...}) (no fsync, no checksum): the usual baseline.
"runner" load = verify sizes + sha256 against the manifest, load_model (safetensors) + torch.load(weights_only=True).
"plain" load = torch.load(weights_only=True) + model.load_state_dict + optimizer.load_state_dict.
"accelerate" = HuggingFace Accelerate's save_state()/load_state() (safetensors weights, pickled optimizer and RNG
states), "fabric" = Lightning Fabric's save()/load() of {"model", "optimizer"} (one torch.save): what a user would
pick instead (benchmarks/alternatives.py; skipped with a note where the bench extra is not installed). Every load is
checked to give back the saved weights.
Before each load the page cache keeps what the last save wrote (both sides alike: a warm-cache comparison);
before each save, os.sync() flushes what earlier steps left dirty, so neither side pays for the other's writeback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' own modules, when loaded by path
import alternatives  # noqa: E402
from overhead import parse_names  # noqa: E402
from runner.checkpoint import find_resume  # noqa: E402
from runner.training.checkpointer import Checkpointer, restore  # noqa: E402
from runner.config import CheckpointConfig, MonitorMode  # noqa: E402


def model_of(million_params: int) -> nn.Module:
    width = 2048
    layers = max(1, round(million_params * 1e6 / (width * width + width)))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def trained(million_params: int):
    torch.manual_seed(0)
    model = model_of(million_params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, 2048)).sum().backward()
    optimizer.step()  # AdamW state (exp_avg, exp_avg_sq) now exists for every parameter
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def runner_save(root: Path, model, optimizer, storage_url: str | None = None) -> Checkpointer:
    """What the training loop waits for: the files written; sealing (hash, fsync, rename) goes on in the background,
    and with `storage_url` the upload to object storage."""
    checkpointer = Checkpointer(root, CheckpointConfig(export=False, dir=storage_url), writer=True, monitor="val/loss",
                                monitor_mode=MonitorMode.min, world_size=1, resolved={"bench": True})
    state = {"optimizer": optimizer.state_dict(), "scheduler": None, "scaler": None, "loop": {"step": 1}}
    checkpointer.save(model, state, {"step": 1, "epoch": 0, "batch_in_epoch": 1}, {})
    return checkpointer


def runner_load(root: Path, model, optimizer, verify: bool = True) -> None:
    path = find_resume("auto", root, verify=verify)
    restore(path, model, optimizer, resolved={"bench": True})


def runner_load_unverified(root: Path, model, optimizer) -> None:
    runner_load(root, model, optimizer, verify=False)


def plain_save(root: Path, model, optimizer) -> None:
    root.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, root / "plain.pt")


def plain_load(root: Path, model, optimizer) -> None:
    state = torch.load(root / "plain.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def measure(million_params: int, repeats: int, directory: Path, arms: tuple[str, ...] = alternatives.ARMS) -> dict:
    """Seconds per save and load for each arm, the arms interleaved (A B C D, B C D A, ...) over `repeats`."""
    import statistics

    model, optimizer = trained(million_params)
    count = sum(p.numel() for p in model.parameters())
    measured = [arm for arm in ("runner", "plain", *alternatives.FRAMEWORKS) if arm in alternatives.available(arms)]
    frameworks = {arm: alternatives.framework(arm) for arm in measured if arm in alternatives.FRAMEWORKS}
    # Each framework saves the objects it set up (set up once: the weights and state are the trained ones).
    wrapped = {arm: framework.setup(model, optimizer) for arm, framework in frameworks.items()}
    times: dict[str, list[float]] = {f"{arm} {what}": [] for arm in measured for what in ("save", "load")}
    times.update({"runner save until sealed": [], "runner load, verify=false": []})
    for index in range(repeats):
        for arm in alternatives.interleaved(measured, index):
            root = directory / arm
            shutil.rmtree(root, ignore_errors=True)
            os.sync()  # start each save with no dirty pages: else one arm pays for another's delayed writeback
            start = time.perf_counter()
            if arm in frameworks:
                frameworks[arm].save(root, *wrapped[arm])
            elif arm == "runner":
                checkpointer = runner_save(root, model, optimizer)
            else:
                plain_save(root, model, optimizer)
            times[f"{arm} save"].append(time.perf_counter() - start)
            if arm == "runner":
                checkpointer.wait()  # sealed: hashed, fsynced, renamed into place
                times["runner save until sealed"].append(time.perf_counter() - start)
            fresh_model, fresh_optimizer = trained(million_params)
            with torch.no_grad():  # so that a load which gave nothing back cannot pass the check below
                next(iter(fresh_model.parameters())).zero_()
            if arm in frameworks:
                fresh_model, fresh_optimizer = frameworks[arm].setup(fresh_model, fresh_optimizer)
                times[f"{arm} load"].append(timed(frameworks[arm].load, root, fresh_model, fresh_optimizer))
            else:
                load = runner_load if arm == "runner" else plain_load
                times[f"{arm} load"].append(timed(load, root, fresh_model, fresh_optimizer))
            if arm == "runner":
                times["runner load, verify=false"].append(timed(runner_load_unverified, root, fresh_model,
                                                                fresh_optimizer))
            assert torch.equal(next(iter(fresh_model.parameters())), next(iter(model.parameters()))), arm
            shutil.rmtree(root, ignore_errors=True)
            del fresh_model, fresh_optimizer
    return {
        "params": count,
        "times": {key: {"median": statistics.median(values), "values": values} for key, values in times.items()},
        "missing": [alternatives.missing_note(arm) for arm in arms if not alternatives.installed(arm)],
    }


def measure_finite_check(million_params: int, repeats: int, directory: Path) -> dict:
    """Seconds of the runner's save (blocked, and until sealed) with and without the finite check, interleaved,
    and of the check alone (parameters and AdamW state)."""
    import statistics

    from runner.training import checkpointer as checkpointer_module
    from runner.training.checkpointer import tensors_are_finite, trained_tensors

    model, optimizer = trained(million_params)
    times: dict[str, list[float]] = {key: [] for key in (
        "save, checked", "save, unchecked", "until sealed, checked", "until sealed, unchecked", "check alone")}
    try:
        for index in range(repeats):
            for check in ((True, False) if index % 2 == 0 else (False, True)):
                name = "checked" if check else "unchecked"
                checkpointer_module.tensors_are_finite = tensors_are_finite if check else (lambda tensors: True)
                root = directory / "finite"
                shutil.rmtree(root, ignore_errors=True)
                os.sync()
                start = time.perf_counter()
                checkpointer = runner_save(root, model, optimizer)
                times[f"save, {name}"].append(time.perf_counter() - start)
                checkpointer.wait()
                times[f"until sealed, {name}"].append(time.perf_counter() - start)
            checkpointer_module.tensors_are_finite = tensors_are_finite
            times["check alone"].append(timed(lambda: tensors_are_finite(trained_tensors(model, optimizer))))
    finally:
        checkpointer_module.tensors_are_finite = tensors_are_finite
    shutil.rmtree(directory / "finite", ignore_errors=True)
    result = {key: statistics.median(values) for key, values in times.items()}
    # Each repeat saves both ways back to back: the median of the paired ratios resists a machine whose load
    # drifts over the minutes of the run better than a ratio of medians.
    for what in ("save", "until sealed"):
        result[f"{what}: checked / unchecked, paired"] = statistics.median(
            with_check / without for with_check, without in zip(times[f"{what}, checked"], times[f"{what}, unchecked"]))
    return result


def measure_object_storage(million_params: int, repeats: int, directory: Path, url: str) -> dict:
    """Seconds to save until sealed on disk vs until committed to `url`, and to load from disk vs fetched from
    `url`, interleaved; with the checkpoint's size in bytes."""
    import statistics

    from runner.checkpoint.remote import Storage

    model, optimizer = trained(million_params)
    storage = Storage(url)
    storage.check()
    times: dict[str, list[float]] = {key: [] for key in (
        "local save until sealed", "save until committed to storage", "local load", "load fetched from storage")}
    size = 0
    for index in range(repeats):
        for remote in ((False, True) if index % 2 == 0 else (True, False)):
            root = directory / ("remote" if remote else "local")
            shutil.rmtree(root, ignore_errors=True)
            if remote and storage.fs.exists(storage.root):
                storage.fs.rm(storage.root, recursive=True)
            os.sync()
            start = time.perf_counter()
            runner_save(root, model, optimizer, url if remote else None).wait()
            times["save until committed to storage" if remote else "local save until sealed"].append(
                time.perf_counter() - start)
            size = sum(path.stat().st_size for path in (root / "checkpoints").glob("step_*/*"))
            fresh_model, fresh_optimizer = trained(million_params)
            with torch.no_grad():
                next(iter(fresh_model.parameters())).zero_()
            if remote:
                elsewhere = directory / "fetched"  # a machine without the run dir: everything comes from storage
                shutil.rmtree(elsewhere, ignore_errors=True)
                start = time.perf_counter()
                path = find_resume("auto", elsewhere, storage=Storage(url))
                restore(path, fresh_model, fresh_optimizer, resolved={"bench": True})
                times["load fetched from storage"].append(time.perf_counter() - start)
                shutil.rmtree(elsewhere, ignore_errors=True)
            else:
                times["local load"].append(timed(runner_load, root, fresh_model, fresh_optimizer))
            assert torch.equal(next(iter(fresh_model.parameters())), next(iter(model.parameters()))), remote
            shutil.rmtree(root, ignore_errors=True)
    return {"bytes": size, "url": url, "times": {key: statistics.median(values) for key, values in times.items()},
            "values": times}


def report_object_storage(result: dict) -> str:
    median, size = result["times"], result["bytes"]
    lines = [f"checkpoint: {size / 1e6:.0f} MB (weights, AdamW state, config, manifest); storage {result['url']}"]
    for key, value in median.items():
        local = median["local save until sealed" if "save" in key else "local load"]
        ratio = "" if key.startswith("local") else f"{value / local:.2f}x local"
        values = ", ".join(f"{seconds:.2f}" for seconds in result["values"][key])
        lines.append(f"{key:34s} median {value:6.2f} s  {size / value / 1e6:7.0f} MB/s  {ratio:12s} ({values})")
    return "\n".join(lines)


def start_moto(directory: Path):
    """moto's S3 server on a free 127.0.0.1 port with a bucket, the environment pointed at it; returns the
    process and the URL to use (the caller stops the process)."""
    import socket
    import subprocess
    import urllib.request

    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "moto.log").open("wb") as log:  # moto logs every request: a pipe would fill and stop it
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"moto's server did not start; see {directory / 'moto.log'}") from None
            time.sleep(0.05)
    # A fresh session: boto3.client()'s default one keeps the credentials of its first use in this process.
    boto3.session.Session().client("s3", region_name="us-east-1").create_bucket(Bucket="bench")
    return server, "s3://bench/checkpoint"


def report_finite_check(median: dict) -> str:
    lines = [f"{key:36s} median {value:6.3f}{'' if 'paired' in key else ' s'}" for key, value in median.items()]
    lines.append(f"the check costs {median['save: checked / unchecked, paired'] - 1:+.1%} on the save training waits "
                 f"for, {median['until sealed: checked / unchecked, paired'] - 1:+.1%} until sealed; alone it takes "
                 f"{median['check alone'] / median['save, unchecked']:.1%} of the save (target <= 5%)")
    return "\n".join(lines)


def report(results: dict) -> str:
    count, times = results["params"], results["times"]
    median = {key: row["median"] for key, row in times.items()}
    out = [f"model: {count / 1e6:.1f}M parameters, {count * 4 / 2**20:.0f} MiB weights + {count * 8 / 2**20:.0f} MiB "
           f"AdamW state; torch {torch.__version__}, {torch.get_num_threads()} threads"]
    for key, row in times.items():
        plain = median["plain save" if " save" in key else "plain load"]
        ratio = "" if key.startswith("plain") else f"{row['median'] / plain:.2f}x plain"
        values = ", ".join(f"{value:.2f}" for value in row["values"])
        out.append(f"{key:26s} median {row['median']:6.2f} s  {ratio:12s} ({values})")
    out += results["missing"]
    out.append(f"save ratio runner/plain: {median['runner save'] / median['plain save']:.2f}x (target <= 1.1x; the "
               f"time training is blocked); until sealed and durable "
               f"{median['runner save until sealed'] / median['plain save']:.2f}x")
    out.append(f"load ratio runner/plain: {median['runner load'] / median['plain load']:.2f}x (target < 1.0x); "
               f"without sha256 verification {median['runner load, verify=false'] / median['plain load']:.2f}x")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=100, help="model size in millions of parameters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/runner-checkpoint-bench"))
    parser.add_argument("--arms", default=",".join(alternatives.ARMS),
                        help=f"comma-separated subset of {','.join(alternatives.ARMS)} (runner and plain always)")
    parser.add_argument("--finite-check", action="store_true",
                        help="measure only the cost of the NaN/inf check done before each save")
    parser.add_argument("--object-storage", metavar="URL",
                        help="measure saving to and loading from this storage (moto: a local S3 server)")
    args = parser.parse_args(argv)
    if args.object_storage:
        server = None
        if args.object_storage == "moto":
            server, args.object_storage = start_moto(args.dir / "moto")
        try:
            print(report_object_storage(measure_object_storage(args.params, args.repeats, args.dir,
                                                               args.object_storage)))
        finally:
            if server is not None:
                server.terminate()
                server.wait()
        return
    if args.finite_check:
        print(report_finite_check(measure_finite_check(args.params, args.repeats, args.dir)))
        return
    arms = ("plain", "runner", *parse_names(parser, "--arms", args.arms, alternatives.ARMS))
    print(report(measure(args.params, args.repeats, args.dir, tuple(dict.fromkeys(arms)))))


if __name__ == "__main__":
    main()
