"""What the runner costs over plain PyTorch, beside what users would pick instead: loop overhead, the allocator, the
data path, start-up time.

    python benchmarks/overhead.py            # the full benchmark (5 pairs; several minutes on 2 busy cores)
    python benchmarks/overhead.py --quick    # 2 pairs, fewer steps, 1 start-up pair (about 2 minutes)
    python benchmarks/overhead.py --only tiny,data --pairs 3 --arms plain,runner

The training loops run four arms on the same work: the plain hand-written loop, the runner's own loop, and the same
plain loop on HuggingFace Accelerate and on Lightning Fabric (benchmarks/alternatives.py; skipped with a note where
the bench extra is not installed). The arms are timed in alternation, A B C D, B C D A, ..., and each arm's per-pair
ratio to the plain arm of the same pair is reported as median and spread [min .. max]: on a machine shared with
other jobs absolute timings drift by 2x and more, but runs that follow each other see nearly the same load. For the
training loops, which is fairer: a fresh process per arm, or one process running every arm after a warm-up? A fresh
process per arm, warmed up, and kept for all pairs:
- fresh, because an arm that runs after another in the same process inherits its grown heap, warm allocator
  free lists, thread pool and cached kernels (an order effect that alternation cannot cancel when the order
  within a pair is fixed), and because what the runner imports (datasets, pyarrow, hydra, TensorBoard and its
  writer thread) would slow the plain arm too and hide the runner's real cost;
- warmed up, because each process pays one-time costs on its first steps (lazy imports, first dispatch, growing
  the heap to its working size) that say nothing about the per-step cost;
- kept, instead of one process per run, so that the runs of a pair follow each other with no process start
  (seconds, here) in between; each timed run still trains a fresh model from the same seed.
Every arm uses one torch thread and the same glibc malloc settings (see PINNED_MALLOC). Each arm reports wall time
(what a user waits for) and its process's CPU time over all its threads (TensorBoard's writer thread included).
The loop verdicts go by CPU time, which on a shared machine leaves out the time other jobs held the cores; on a
quiet machine the two agree, and both are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' own modules, when loaded by path
import alternatives  # noqa: E402

# glibc's malloc returns the heap top to the OS whenever more than M_TRIM_THRESHOLD sits free above it, and a
# small training step frees all of its temporaries at once: the next step faults the same pages back in (~30% of
# a small step here). Both arms get the same pins so a ratio measures the runner, not the allocator; the "malloc"
# section measures what the runner would gain by setting them itself.
PINNED_MALLOC = {
    "MALLOC_TOP_PAD_": str(64 << 20),  # keep 64 MiB above the heap top when trimming or growing it
    "MALLOC_TRIM_THRESHOLD_": str(128 << 20),  # only give memory back once 128 MiB lie free at the top
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # tensors up to 32 MiB (glibc's maximum) come from the heap, not mmap
}
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SECTIONS = ("mlp", "tiny", "malloc", "data", "startup")


@dataclass(frozen=True)
class Workload:
    """One model, data set and batch size, trained identically by both arms."""

    name: str
    in_features: int
    hidden: tuple[int, ...]  # () is a single Linear layer
    batch_size: int
    steps: int
    warmup: int
    rows: int = 4096
    classes: int = 10

    def describe(self) -> str:
        shape = "-".join(str(n) for n in (self.in_features, *self.hidden, self.classes))
        return f"{'MLP' if self.hidden else 'Linear'} {shape}, batch {self.batch_size}"


WORKLOADS = {
    # 150 steps a timed run (10 rounds): each run ends with an evaluation, which costs the runner ~2 ms more than
    # the plain loop's argmax (accuracy, macro-F1, the loss, logging them): 1.7% of a 60-step run, 0.7% of this.
    "mlp": Workload("mlp", 64, (256, 256), batch_size=128, steps=1500, warmup=60),
    # A step of a 32->10 Linear is almost nothing but loop overhead: the worst case for a runner.
    "tiny": Workload("tiny", 32, (), batch_size=64, steps=2000, warmup=200),
}


class Clock:
    """Wall time (what a user waits for) and this process's CPU time over all its threads: on a shared machine the
    CPU time is the steadier of the two, as it leaves out the time other jobs held the cores."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall": time.perf_counter() - self.wall, "cpu": time.process_time() - self.cpu}


def make_model(workload: Workload):
    """The same layers as runner.models.MLP (a Sequential of Linear and ReLU), built without importing runner."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers, width = [], workload.in_features
    for size in workload.hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, workload.classes))


def make_data(workload: Workload):
    """(features, labels) for training and one batch of each for validation, from a fixed seed."""
    import torch

    generator = torch.Generator().manual_seed(1)
    rows = workload.rows + workload.batch_size
    features = torch.randn(rows, workload.in_features, generator=generator)
    labels = torch.randint(0, workload.classes, (rows,), generator=generator)
    cut = workload.rows
    return (features[:cut], labels[:cut]), (features[cut:], labels[cut:])


def make_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # as conf/optimizer/adamw.yaml


def plain_fit(workload: Workload, steps: int, data, framework=None) -> dict[str, float]:
    """Seconds for `steps` optimizer steps and a final evaluation, written the way a tutorial would. With a
    `framework` (benchmarks/alternatives.py: Accelerate or Fabric): the same loop as its README writes one, the model
    and optimizer set up through it and its backward()."""
    import torch
    import torch.nn.functional as F

    (features, labels), (val_features, val_labels) = data
    model = make_model(workload)
    optimizer = make_optimizer(model)
    if framework is not None:
        model, optimizer = framework.setup(model, optimizer)
    backward = (lambda loss: loss.backward()) if framework is None else framework.backward
    clock = Clock()
    step = 0
    while step < steps:
        order = torch.randperm(len(features))
        for first in range(0, len(features) - workload.batch_size + 1, workload.batch_size):
            rows = order[first : first + workload.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(features[rows]), labels[rows])
            backward(loss)
            optimizer.step()
            step += 1
            if step == steps:
                break
    model.eval()
    with torch.no_grad():
        accuracy = (model(val_features).argmax(-1) == val_labels).float().mean().item()
    model.train()
    assert 0 <= accuracy <= 1
    return clock.read()


def to_splits(data):
    """The benchmark's tensors as the `datasets` splits a runner data factory returns."""
    import datasets

    def split(features, labels):
        schema = datasets.Features(
            {
                "features": datasets.Sequence(datasets.Value("float32"), length=features.shape[1]),
                "label": datasets.Value("int64"),
            }
        )
        return datasets.Dataset.from_dict({"features": features.numpy(), "label": labels.numpy()}, features=schema)

    return {"train": split(*data[0]), "validation": split(*data[1])}


def runner_fit(workload: Workload, steps: int, splits, run_dir: Path) -> dict[str, float]:
    """Seconds for the runner's own loop on the same work, wired by runner.run.wiring exactly as a run wires it."""
    from runner.accelerate.accelerator import Accelerator
    from runner.config import RunConfig, TrainerConfig
    from runner.training.batch_plan import batch_plan
    from runner.run.wiring import build_parts, make_loop

    # Schema defaults (log every 10 steps, ...) except: one evaluation, at the end, like the plain arm.
    config = RunConfig(
        model={"_target_": "runner.models.MLP", "in_features": workload.in_features,
               "out_features": workload.classes, "hidden": list(workload.hidden)},
        optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.01},
        task={"_target_": "runner.tasks.Classification"},
        # What conf/config.yaml's defaults list selects (logger: [tensorboard]); the schema's own default is none.
        logger={"tensorboard": {"_target_": "runner.loggers.TensorBoardSink", "_partial_": True}},
        trainer=TrainerConfig(max_epochs=10**6, max_steps=steps, batch_size=workload.batch_size,
                              eval_every_steps=steps, progress_bar=False),
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator("cpu", "fp32")
    batch = batch_plan(config.trainer, processes=1)
    parts = build_parts(config, batch, accelerator, splits=splits)
    loop = make_loop(parts, config, batch, accelerator, run_dir, checkpoints=False)
    loop.logger.log_config({"benchmark": workload.name})
    clock = Clock()
    final = loop.fit()
    elapsed = clock.read()
    loop.logger.log_final({"benchmark": workload.name}, final)
    loop.logger.close()
    assert 0 <= final["val/accuracy"] <= 1
    return elapsed


def serve_arm(loop: str, workload: Workload, steps: int, warmup: int) -> None:
    """One arm in this fresh process: warm up, say "ready", then time a run (fresh model) for each "run" line."""
    import torch

    torch.set_num_threads(1)
    data = make_data(workload)
    with tempfile.TemporaryDirectory() as tmp:
        if loop == "plain":
            fit = lambda count, name: plain_fit(workload, count, data)  # noqa: E731
        elif loop == "runner":
            splits = to_splits(data)
            fit = lambda count, name: runner_fit(workload, count, splits, Path(tmp) / name)  # noqa: E731
        else:  # what a user would pick instead of the runner (the bench extra)
            framework = alternatives.framework(loop)
            fit = lambda count, name: plain_fit(workload, count, data, framework)  # noqa: E731
        fit(warmup, "warmup")
        print("ready", flush=True)
        for index, command in enumerate(sys.stdin):
            if command.strip() != "run":
                break
            print(json.dumps(fit(steps, f"run{index}")), flush=True)


class Arm:
    """One arm living in its own fresh process with these malloc settings, warmed up, timing a run on request.

    Both arms of a comparison are started (and warmed up) before the first pair, so the runs of a pair follow
    each other with no process start in between: what the other jobs on the machine do changes little
    between the A and the B of one pair."""

    def __init__(self, loop: str, workload: Workload, steps: int, warmup: int, malloc: dict[str, str]):
        env = {key: value for key, value in os.environ.items() if key not in PINNED_MALLOC}
        env.update(THREADS)
        env.update(malloc)
        self.name, self.steps = loop, steps
        self.stderr = tempfile.TemporaryFile("w+")
        command = [sys.executable, str(Path(__file__).resolve()), "--arm", loop, "--workload", workload.name,
                   "--steps", str(steps), "--warmup", str(warmup)]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True)

    def _reply(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.stderr.seek(0)
            raise RuntimeError(f"the {self.name} arm failed:\n{self.stderr.read()[-3000:]}")
        return line

    def ready(self) -> "Arm":
        assert self._reply().strip() == "ready"
        return self

    def run(self) -> dict[str, float]:
        """Wall and CPU seconds per step of one timed run."""
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        measured = json.loads(self._reply())
        return {clock: measured[clock] / self.steps for clock in ("wall", "cpu")}

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        self.stderr.close()


def alternate(arms: list[tuple], workload: Workload, pairs: int, steps: int, warmup: int, rounds: int):
    """Per-step times of several arms, each (loop, malloc) in its own process, timed in alternation: one list of
    per-pair {"wall", "cpu"} seconds per arm.

    A pair is `rounds` rounds of steps/rounds steps per arm, in alternatives.interleaved's order (A B C, B C A,
    C A B, ...): short, interleaved runs see nearly the same load from the machine's other jobs, and the rotation
    cancels a steady drift."""
    per_round = max(2, steps // rounds)
    processes = [Arm(loop, workload, per_round, warmup, malloc) for loop, malloc in arms]
    try:
        for process in processes:
            process.ready()
        times = [[] for _ in processes]
        for _ in range(pairs):
            totals = [{"wall": 0.0, "cpu": 0.0} for _ in processes]
            for index in range(rounds):
                for which in alternatives.interleaved(range(len(processes)), index):
                    measured = processes[which].run()
                    totals[which] = {clock: totals[which][clock] + measured[clock] / rounds for clock in measured}
            for which, total in enumerate(totals):
                times[which].append(total)
        return times
    finally:
        for process in processes:
            process.close()


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def caching_bytecode(env: dict[str, str]) -> dict[str, str]:
    """`env` as a user's Python starts in it, for timing start-ups: Python caches compiled modules by default.
    A machine that sets PYTHONDONTWRITEBYTECODE (these test machines do) makes every start compile the runner's
    own sources again (an editable install ships none compiled: 0.03 s of `from runner import Accelerator`, about
    0.1 s of `python -m runner`), while its dependencies come compiled by pip; that is a property of the machine,
    not of the runner. The cache lands in the git-ignored __pycache__ folders."""
    return {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}


def compare_loops(workload: Workload, pairs: int, steps: int, warmup: int, rounds: int = 10,
                  arms: tuple[str, ...] = alternatives.ARMS) -> dict:
    """The plain loop, the runner and the frameworks users would pick instead (those installed), on the same work
    in the same run, interleaved. Per arm and per pair: ms per step, and against the plain arm of the same pair the
    steps/s ratio (arm / plain) and the added ms per step, by wall and by CPU time."""
    measured = ("plain", *(arm for arm in alternatives.available(arms) if arm != "plain"))
    times = dict(zip(measured, alternate([(arm, PINNED_MALLOC) for arm in measured], workload, pairs, steps, warmup,
                                         rounds)))
    plain = times["plain"]

    def against_plain(arm_times: list[dict]) -> dict:
        return {
            "ms": spread([t["wall"] * 1e3 for t in arm_times]),
            "cpu_ms": spread([t["cpu"] * 1e3 for t in arm_times]),
            "ratio": spread([p["wall"] / t["wall"] for p, t in zip(plain, arm_times)]),
            "cpu_ratio": spread([p["cpu"] / t["cpu"] for p, t in zip(plain, arm_times)]),
            "overhead_ms": spread([(t["wall"] - p["wall"]) * 1e3 for p, t in zip(plain, arm_times)]),
            "cpu_overhead_ms": spread([(t["cpu"] - p["cpu"]) * 1e3 for p, t in zip(plain, arm_times)]),
        }

    return {
        "workload": workload.describe(),
        "steps": steps,
        "arms": {arm: against_plain(arm_times) for arm, arm_times in times.items()},
        "missing": [alternatives.missing_note(arm) for arm in arms if not alternatives.installed(arm)],
    }


def compare_malloc(workload: Workload, pairs: int, steps: int, warmup: int, rounds: int = 10) -> dict:
    """The runner's loop with glibc's default malloc vs PINNED_MALLOC: what setting it would gain."""
    default, pinned = alternate([("runner", {}), ("runner", PINNED_MALLOC)], workload, pairs, steps, warmup, rounds)
    return {
        "workload": workload.describe(),
        "default_ms": spread([d["wall"] * 1e3 for d in default]),
        "pinned_ms": spread([p["wall"] * 1e3 for p in pinned]),
        "speedup": spread([d["wall"] / p["wall"] for d, p in zip(default, pinned)]),
        "cpu_speedup": spread([d["cpu"] / p["cpu"] for d, p in zip(default, pinned)]),
    }


def data_path(pairs: int, rows: int = 50_000, width: int = 64, batch_size: int = 256, epochs: int = 4) -> dict:
    """Batches/s of the runner's batch sources against hand-written indexing of the same data, alternated."""
    import torch

    from runner.data.batches import ArrowBatches, TensorBatches, make_batches

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(2)
    features, labels = torch.randn(rows, width, generator=generator), torch.randint(0, 10, (rows,), generator=generator)
    dataset = to_splits(((features, labels), (features[:1], labels[:1])))["train"]
    tensor_batches = make_batches(dataset, batch_size, True, 0, in_memory_limit_mb=4096)
    arrow_batches = make_batches(dataset, batch_size, True, 0, in_memory_limit_mb=0)  # the large-split path
    assert isinstance(tensor_batches, TensorBatches) and isinstance(arrow_batches, ArrowBatches)
    table = dataset.with_format("arrow")

    def plain_tensors(epoch: int):
        order = torch.randperm(rows)
        for first in range(0, rows, batch_size):
            index = order[first : first + batch_size]
            yield {"features": features[index], "label": labels[index]}

    def plain_index_select(epoch: int):  # the fastest hand-written form found here
        for index in torch.randperm(rows).split(batch_size):
            yield {"features": features.index_select(0, index), "label": labels.index_select(0, index)}

    def plain_arrow(epoch: int):  # the fast recipe from NOTES-technical.md section 4, written out by hand
        order = torch.randperm(rows)
        for first in range(0, rows, batch_size):
            batch = table[order[first : first + batch_size].tolist()]
            flat = batch.column("features").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            yield {"features": torch.from_numpy(flat.reshape(-1, width).copy()),
                   "label": torch.from_numpy(batch.column("label").to_numpy().copy())}

    def runner_epochs(batches, epoch: int):
        batches.set_epoch(epoch)  # what the loop calls before each epoch
        return iter(batches)

    def seconds(epoch_batches, epochs: int) -> float:
        start = time.perf_counter()
        for epoch in range(epochs):
            for batch in epoch_batches(epoch):
                assert batch["features"].shape[1] == width
        return time.perf_counter() - start

    arms = {
        "tensors": (lambda e: runner_epochs(tensor_batches, e), plain_tensors, epochs),
        "index_select": (lambda e: runner_epochs(tensor_batches, e), plain_index_select, epochs),
        "arrow": (lambda e: runner_epochs(arrow_batches, e), plain_arrow, max(1, epochs // 4)),
    }
    batches_per_epoch = len(tensor_batches)
    result = {"rows": rows, "batch_size": batch_size}
    for name, (runner_arm, plain_arm, arm_epochs) in arms.items():
        seconds(runner_arm, 1), seconds(plain_arm, 1)  # warm-up
        runner_rates, plain_rates = [], []
        for _ in range(pairs):  # a pair: 4 interleaved rounds, A B B A A B B A, as for the loops
            totals = [0.0, 0.0]
            for index in range(4):
                for which in ((0, 1) if index % 2 == 0 else (1, 0)):
                    totals[which] += seconds((runner_arm, plain_arm)[which], arm_epochs)
            runner_rates.append(4 * arm_epochs * batches_per_epoch / totals[0])
            plain_rates.append(4 * arm_epochs * batches_per_epoch / totals[1])
        result[name] = {
            "runner_batches_per_s": spread(runner_rates),
            "plain_batches_per_s": spread(plain_rates),
            "ratio": spread([r / p for r, p in zip(runner_rates, plain_rates)]),
        }
    tensor_rates = result["tensors"]["plain_batches_per_s"]["median"]
    result["arrow"]["vs_tensors"] = result["arrow"]["runner_batches_per_s"]["median"] / tensor_rates
    return result


# The plain arm of the start-up comparison: import torch, build the default recipe's model (the layers of
# runner.models.SeqTransformer, inline so that nothing of the runner is imported), take one AdamW step.
PLAIN_FIRST_STEP = """
import time
import torch
import torch.nn.functional as F
from torch import nn

class SeqTransformer(nn.Module):
    def __init__(self, vocab_size=10, max_len=12, d_model=64, nhead=4, num_layers=2, dim_feedforward=128):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, 0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        return self.head(self.norm(self.encoder(self.embed(tokens) + self.position[: tokens.shape[1]])))

torch.manual_seed(0)
model = SeqTransformer()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
source = torch.randint(0, 10, (32, 12))
loss = F.cross_entropy(model(source).reshape(-1, 10), source.flip(1).reshape(-1))
loss.backward()
optimizer.step()
print(time.time())
"""

# The default recipe on tiny data (tests/conftest.py's TINY), logging the first step so its time is on record.
RUNNER_FIRST_STEP = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=32",
                     "trainer.max_steps=1", "trainer.log_every_steps=1")


def first_step_times(run_dir: Path) -> tuple[float, float]:
    """(when the worker started, when step 1 was logged) as Unix times, read from the run's own outputs:
    the first line of runner.log (Hydra's timestamp, ms resolution) and TensorBoard's wall time of train/loss."""
    from datetime import datetime

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    first_step = next(event.wall_time for event in events.Scalars("train/loss") if event.step == 1)
    stamp = (run_dir / "runner.log").read_text().splitlines()[0][1:24]  # "[2026-01-01 12:00:00,123]..."
    worker_start = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return worker_start, first_step


# The same script, first importing the libraries the runner is built on: the difference between this and the
# runner is the runner's own work (composition, checks, run dir, reading the cached data, building, preparing).
PLAIN_WITH_LIBRARIES = """
import datasets, hydra, omegaconf, safetensors.torch, tqdm, yaml
from torch.utils.tensorboard import SummaryWriter
""" + PLAIN_FIRST_STEP


def script_on(imports: str, setup: str, backward: str) -> str:
    """The raw script's loop on a framework, as a hand-written script uses one: the difference from the raw script is
    importing and setting up the framework alone."""
    optimizer_line = "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)\n"
    return (PLAIN_FIRST_STEP.replace("torch.manual_seed(0)\n", imports + "torch.manual_seed(0)\n")
            .replace(optimizer_line, optimizer_line + setup + "\n").replace("loss.backward()", backward))


# Issue 14 asks the script on runner.Accelerator to start within 1.02x of the raw script; the others are what
# users would pick instead.
SCRIPTS_ON = {
    "runner": script_on("from runner import Accelerator\naccelerator = Accelerator(cpu=True)\n",
                        "model, optimizer = accelerator.prepare(model, optimizer)", "accelerator.backward(loss)"),
    "accelerate": script_on("from accelerate import Accelerator\naccelerator = Accelerator(cpu=True)\n",
                            "model, optimizer = accelerator.prepare(model, optimizer)", "accelerator.backward(loss)"),
    "fabric": script_on("from lightning_fabric import Fabric\n"
                        "fabric = Fabric(accelerator='cpu', devices=1, precision='32-true')\n",
                        "model, optimizer = fabric.setup(model, optimizer)", "fabric.backward(loss)"),
}


def startup(pairs: int, arms: tuple[str, ...] = alternatives.ARMS, warmup: bool = True) -> dict:
    """Seconds from process start to the first optimizer step, alternated: `python -m runner`, and the raw script
    alone, importing the runner's libraries, and on each framework's Accelerator-like object. warmup=False skips the
    unmeasured warm-up runs (the first runner run then generates the data): each command launched once a pair, for
    a smoke test."""
    scripts = {arm: SCRIPTS_ON[arm] for arm in alternatives.available(arms) if arm in SCRIPTS_ON}
    with tempfile.TemporaryDirectory() as tmp:
        # A private datasets cache, warmed by the first (unmeasured) run, so no run here generates data.
        env = caching_bytecode({**os.environ, "HF_DATASETS_CACHE": str(Path(tmp) / "hf_cache")})

        def run(command: list[str], name: str) -> tuple[float, float, subprocess.CompletedProcess]:
            started = time.time()
            result = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
            return started, time.time(), result

        def runner_once(index: int) -> tuple[float, float, float]:
            """(to the first step, to the worker, from the run's last write to the process's exit)"""
            run_dir = Path(tmp) / f"run{index}"
            started, ended, _ = run([sys.executable, "-m", "runner", *RUNNER_FIRST_STEP, f"hydra.run.dir={run_dir}"],
                                    "runner")
            worker_start, first_step = first_step_times(run_dir)
            last_write = max(path.stat().st_mtime for path in run_dir.rglob("*") if path.is_file())
            return first_step - started, worker_start - started, ended - last_write

        def plain_once(script: str) -> float:
            return plain_timed(script)[0]

        def plain_timed(script: str) -> tuple[float, float]:
            """(seconds to the first step; from it, the script's last work, to the process's exit)"""
            started, ended, result = run([sys.executable, "-c", script], "plain script")
            first_step = float(result.stdout.split()[-1])
            return first_step - started, ended - first_step

        # Warm the datasets cache and the OS file cache, the frameworks' files included.
        if warmup:
            runner_once(-1), plain_once(PLAIN_WITH_LIBRARIES), [plain_once(script) for script in scripts.values()]
        runner_s, to_worker_s, plain_s, libraries_s, runner_exit_s, libraries_exit_s = [], [], [], [], [], []
        on: dict[str, list[float]] = {arm: [] for arm in scripts}
        for index in range(pairs):
            total, to_worker, exit_s = runner_once(index)
            runner_s.append(total), to_worker_s.append(to_worker), runner_exit_s.append(exit_s)
            plain_s.append(plain_once(PLAIN_FIRST_STEP))
            total, exit_s = plain_timed(PLAIN_WITH_LIBRARIES)
            libraries_s.append(total), libraries_exit_s.append(exit_s)
            for arm, script in scripts.items():
                on[arm].append(plain_once(script))
    return {
        "plain_s": spread(plain_s),
        "plain_with_libraries_s": spread(libraries_s),
        "runner_s": spread(runner_s),
        "runner_to_worker_s": spread(to_worker_s),
        "added_s": spread([r - p for r, p in zip(runner_s, plain_s)]),
        "added_own_s": spread([r - p for r, p in zip(runner_s, libraries_s)]),
        # Stopping: from the last thing each wrote (the runner: any file in its run dir) to its process's exit.
        "runner_exit_s": spread(runner_exit_s),
        "plain_with_libraries_exit_s": spread(libraries_exit_s),
        "script_on": {arm: {"s": spread(times), "ratio": spread([t / p for t, p in zip(times, plain_s)])}
                      for arm, times in on.items()},
        "missing": [alternatives.missing_note(arm) for arm in arms if not alternatives.installed(arm)],
    }


def _range(stats: dict, fmt: str) -> str:
    return f"{stats['median']:{fmt}} [{stats['min']:{fmt}} .. {stats['max']:{fmt}}]"


def verdicts(results: dict) -> list[str]:
    """One line per target (issue 14): PASS/MISS, the median, the spread, the target."""
    lines = []

    def verdict(ok: bool, text: str) -> None:
        lines.append(f"{'PASS' if ok else 'MISS'} {text}")

    # Loop verdicts go by CPU time: with other jobs holding the cores, wall time mostly measures the scheduler
    # (back-to-back runs of the same arm differ by up to 2x here). On a quiet machine the two agree.
    if "mlp" in results:
        runner = results["mlp"]["arms"]["runner"]
        cpu, wall = runner["cpu_ratio"], runner["ratio"]
        verdict(cpu["median"] >= 0.99, f"mlp: runner at {_range(cpu, '.3f')}x the plain loop's steps per CPU second, "
                                       f"{_range(wall, '.3f')}x per wall second (target >= 0.99x)")
    if "tiny" in results:
        runner = results["tiny"]["arms"]["runner"]
        cpu, wall = runner["cpu_overhead_ms"], runner["overhead_ms"]
        verdict(cpu["median"] <= 0.05, f"tiny: runner adds {_range(cpu, '+.3f')} CPU ms/step, {_range(wall, '+.3f')} "
                                       "wall ms/step (target <= +0.05 ms)")
    if "malloc" in results:
        for name, row in results["malloc"].items():
            lines.append(f"INFO malloc/{name}: pinning glibc malloc would make the runner "
                         f"{_range(row['cpu_speedup'], '.3f')}x as fast in CPU time, {_range(row['speedup'], '.3f')}x "
                         "in wall time, as with glibc's defaults")
    if "data" in results:
        for name in ("tensors", "arrow"):
            ratio = results["data"][name]["ratio"]
            baseline = "indexing in-memory tensors" if name == "tensors" else "hand-written Arrow batches"
            verdict(ratio["median"] >= 0.9, f"data/{name}: runner at {_range(ratio, '.3f')}x the batches/s of "
                                            f"{baseline} (target >= 0.9x)")
        lines.append(f"INFO data/index_select: runner at {_range(results['data']['index_select']['ratio'], '.3f')}x "
                     "the batches/s of the fastest hand-written indexing (index_select on split row orders)")
        lines.append(f"INFO data/arrow: the large-split path runs at {results['data']['arrow']['vs_tensors']:.3f}x "
                     "the batches/s of in-memory tensors (why splits that fit are materialised)")
    if "startup" in results:
        own, added = results["startup"]["added_own_s"], results["startup"]["added_s"]
        verdict(own["median"] <= 0.3, f"startup: the runner's own work adds {_range(own, '+.2f')} s before the first "
                                      "optimizer step (target <= +0.3 s beyond a plain script importing the same "
                                      "libraries)")
        lines.append(f"INFO startup: in all the runner starts {_range(added, '+.2f')} s later than a plain script "
                     "that imports only torch (the rest is importing datasets/pandas, hydra and tensorboard)")
        lines.append(f"INFO stopping: the runner exits {_range(results['startup']['runner_exit_s'], '.2f')} s after "
                     "its last write; the plain script importing the same libraries "
                     f"{_range(results['startup']['plain_with_libraries_exit_s'], '.2f')} s after its first step")
        on_accelerator = results["startup"]["script_on"].get("runner")
        if on_accelerator:
            ratio = on_accelerator["ratio"]
            verdict(ratio["median"] <= 1.02, f"startup/accelerator: a raw script on runner.Accelerator reaches its "
                                             f"first step at {_range(ratio, '.3f')}x the raw script's time "
                                             "(target <= 1.02x)")
    return lines


def report(results: dict, pairs: int) -> str:
    import torch

    out = [f"runner overhead vs plain PyTorch | torch {torch.__version__}, {THREADS['OMP_NUM_THREADS']} thread, CPU "
           f"| {pairs} pairs, arms interleaved, a fresh process per arm, median [min .. max]"]
    loops = [name for name in ("mlp", "tiny") if name in results]
    for name in loops:
        row = results[name]
        out.append(f"loop {name}: {row['workload']}, {row['steps']} steps (malloc pinned in every arm)")
        out.append(f"  {'arm':24} {'ms/step':>9} {'steps/s x plain (wall)':>26} {'(CPU)':>26} "
                   f"{'added CPU ms/step':>28}")
        for arm, stats in row["arms"].items():
            out.append(f"  {alternatives.LABELS[arm]:24} {stats['ms']['median']:9.3f} "
                       f"{_range(stats['ratio'], '.3f'):>26} {_range(stats['cpu_ratio'], '.3f'):>26} "
                       f"{_range(stats['cpu_overhead_ms'], '+.3f'):>28}")
        out += [f"  {note}" for note in row["missing"]]
    if "malloc" in results:
        out.append(f"{'malloc: runner, glibc defaults vs pinned':44} {'default ms/step':>14} {'pinned ms/step':>15} "
                   f"{'speed-up from pinning':>28} {'the same, CPU time':>30}")
        for name, row in results["malloc"].items():
            out.append(f"  {name:5} {row['workload']:37} {row['default_ms']['median']:14.3f} "
                       f"{row['pinned_ms']['median']:15.3f} {_range(row['speedup'], '.3f'):>28} "
                       f"{_range(row['cpu_speedup'], '.3f'):>30}")
    if "data" in results:
        data = results["data"]
        out.append(f"{'data path: ' + str(data['rows']) + ' rows x 64, batch ' + str(data['batch_size']):44} "
                   f"{'plain batch/s':>14} {'runner batch/s':>15} {'runner/plain':>28}")
        labels = {"tensors": "TensorBatches vs tensor[rows]", "index_select": "TensorBatches vs index_select",
                  "arrow": "ArrowBatches vs Arrow by hand"}
        for name, label in labels.items():
            row = data[name]
            out.append(f"  {label:42} {row['plain_batches_per_s']['median']:14.0f} "
                       f"{row['runner_batches_per_s']['median']:15.0f} {_range(row['ratio'], '.3f'):>28}")
    if "startup" in results:
        row = results["startup"]
        out.append(f"{'start-up: process start to first step':44} {'plain s':>14} {'runner s':>15} "
                   f"{'runner minus plain s':>28} {'minus plain+libraries s':>30}")
        out.append(f"  {'default recipe, tiny data, cache warm':42} {row['plain_s']['median']:14.2f} "
                   f"{row['runner_s']['median']:15.2f} {_range(row['added_s'], '+.2f'):>28} "
                   f"{_range(row['added_own_s'], '+.2f'):>30}")
        to_worker = f"(runner: process start to worker {row['runner_to_worker_s']['median']:.2f} s)"
        out.append(f"  {'plain script + the runner libraries':42} {row['plain_with_libraries_s']['median']:14.2f} "
                   f"{to_worker:>46}")
        out.append(f"  {'last write to process exit (stopping)':42} "
                   f"{_range(row['plain_with_libraries_exit_s'], '.2f'):>14} {_range(row['runner_exit_s'], '.2f'):>15}"
                   "   (plain: the script importing the runner's libraries)")
        for arm, stats in row["script_on"].items():
            label = "runner.Accelerator" if arm == "runner" else alternatives.LABELS[arm]
            out.append(f"  {'plain script on ' + label:42} {stats['s']['median']:14.2f} {'':15} "
                       f"{'x plain: ' + _range(stats['ratio'], '.3f'):>28}")
        out += [f"  {note}" for note in row["missing"]]
    return "\n".join(out + verdicts(results))


def run_benchmark(sections, pairs: int, steps_scale: float, startup_pairs: int, rounds: int = 10,
                  arms: tuple[str, ...] = alternatives.ARMS) -> dict:
    results: dict = {}

    def budget(workload: Workload) -> tuple[int, int]:
        return max(2, int(workload.steps * steps_scale)), max(1, int(workload.warmup * steps_scale))

    for name in ("mlp", "tiny"):
        if name in sections:
            results[name] = compare_loops(WORKLOADS[name], pairs, *budget(WORKLOADS[name]), rounds, arms)
    if "malloc" in sections:
        results["malloc"] = {
            name: compare_malloc(workload, pairs, *budget(workload), rounds) for name, workload in WORKLOADS.items()
        }
    if "data" in sections:
        results["data"] = data_path(pairs, epochs=max(1, int(4 * steps_scale)))
    if "startup" in sections:
        results["startup"] = startup(startup_pairs, arms)
    return results


def parse_names(parser: argparse.ArgumentParser, option: str, text: str, valid: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(names) - set(valid))
    if unknown:
        parser.error(f"{option}: unknown name(s) {', '.join(unknown)}; choose from {', '.join(valid)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="interleaved pairs per comparison (default 5)")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="scale every arm's step count")
    parser.add_argument("--startup-pairs", type=int, default=None, help="start-up pairs (default: --pairs)")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds per loop pair (default 10)")
    parser.add_argument("--quick", action="store_true",
                        help="2 pairs of 4 rounds, a quarter of the steps, 1 start-up pair")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--arms", default=",".join(alternatives.ARMS),
                        help=f"comma-separated subset of {','.join(alternatives.ARMS)} (plain is always measured)")
    parser.add_argument("--json", type=Path, help="also write the raw figures to this file")
    # Internal: how Arm starts one arm in a fresh process.
    parser.add_argument("--arm", choices=alternatives.ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=tuple(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm:
        serve_arm(args.arm, WORKLOADS[args.workload], args.steps, args.warmup)
        return
    sections = parse_names(parser, "--only", args.only, SECTIONS)
    arms = parse_names(parser, "--arms", args.arms, alternatives.ARMS)
    pairs, scale, rounds = (2, args.steps_scale / 4, 4) if args.quick else (args.pairs, args.steps_scale, args.rounds)
    startup_pairs = args.startup_pairs or (1 if args.quick else pairs)
    results = run_benchmark(sections, pairs, scale, startup_pairs, rounds, arms)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(report(results, pairs))


if __name__ == "__main__":
    main()
