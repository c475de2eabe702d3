"""Test-only `_target_`s for distributed tests, importable by the CLI's workers when tests/ is on PYTHONPATH
(the tests pass `allowed_targets` with the `dist_helpers.` prefix).

A model that fails (or stalls) on one chosen rank at one chosen training forward pass: the way to make "rank 1
raises at step k" happen inside a real run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from torch import nn

from runner.training.callbacks import Callback
from runner.models import SeqTransformer
from runner.training.tasks import SequenceToSequence


class FaultySeqTransformer(nn.Module):
    """SeqTransformer whose `fail_rank` raises at its `fail_at_forward`-th training forward pass (1-based), and whose
    `hang_rank` stops there for an hour, after creating the file `hang_marker` (if given) for a test to wait on; with
    a marker it hangs once (a restarted attempt that finds the file runs on).
    `sleep_s` slows every training forward pass, to keep a run alive long enough to signal or kill its launcher."""

    def __init__(self, fail_rank: int = -1, fail_at_forward: int = 0, sleep_s: float = 0.0, hang_rank: int = -1,
                 hang_at_forward: int = 0, fail_attempt: int | None = None, hang_marker: str | None = None,
                 **model_kwargs):
        super().__init__()
        self.model = SeqTransformer(**model_kwargs)
        self.fail_rank, self.fail_at_forward, self.sleep_s = fail_rank, fail_at_forward, sleep_s
        # fail_attempt: fail only in that attempt of the group (TORCHELASTIC_RESTART_COUNT), e.g. 0: the first.
        if fail_attempt is not None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) != fail_attempt:
            self.fail_rank = -1
        self.hang_rank, self.hang_at_forward, self.hang_marker = hang_rank, hang_at_forward, hang_marker
        self.training_forwards = 0

    def forward(self, tokens):
        if self.training:
            self.training_forwards += 1
            # Tests may read the environment; the runner package may not (only dist.py does).
            if int(os.environ.get("RANK", 0)) == self.fail_rank and self.training_forwards == self.fail_at_forward:
                raise ValueError(f"injected failure at training forward {self.training_forwards}")
            hung_before = bool(self.hang_marker) and os.path.exists(self.hang_marker)  # once: a restart runs on
            if int(os.environ.get("RANK", 0)) == self.hang_rank and self.training_forwards == self.hang_at_forward \
                    and not hung_before:
                if self.hang_marker:
                    open(self.hang_marker, "w").close()
                time.sleep(3600)  # a rank stuck in its own code (a deadlock, a dead file system): its peers wait
            time.sleep(self.sleep_s)
        return self.model(tokens)


# Functions run in each of 2 processes by the elastic launcher (importable, so any start method can run them).

def config_mismatch_between_ranks() -> str | None:
    from runner.distributed.dist import DistInfo, config_mismatch, init_process_group

    info = DistInfo.from_env()
    init_process_group(info, "gloo", timeout_s=60)
    resolved = {"seed": 0, "hardware": {"machine_rank": info.rank}, "optimizer": {"lr": 0.1 * (info.rank + 1)}}
    return config_mismatch(resolved)


def record_main_first_order(path: str) -> bool:
    from runner.distributed.dist import DistInfo, init_process_group, local_main_first

    info = DistInfo.from_env()
    init_process_group(info, "gloo", timeout_s=60)
    if info.rank == 0:
        time.sleep(0.5)  # rank 1 would write first if it did not wait
    with local_main_first(info):
        with open(path, "a") as handle:
            handle.write(f"{info.rank}\n")
    return True


def step_at_which_ranks_stop(signal_rank: int, signal_after_step: int) -> int:
    """Each rank asks StopSignals after every step; `signal_rank` gets SIGUSR1 after `signal_after_step`."""
    import signal

    from runner.distributed.dist import DistInfo, init_process_group
    from runner.distributed.signals import StopSignals

    info = DistInfo.from_env()
    init_process_group(info, "gloo", timeout_s=60)
    with StopSignals(["SIGUSR1"], distributed=True) as stop:
        for step in range(1, 20):
            if info.rank == signal_rank and step == signal_after_step:
                os.kill(os.getpid(), signal.SIGUSR1)
            if info.rank != signal_rank:
                time.sleep(0.01)  # the ranks are not in lockstep
            if stop.requested():
                return step
    return -1


class WithAnUnusedLayer(nn.Module):
    """SeqTransformer plus a layer the forward never uses: DDP needs parallel.find_unused_parameters for it."""

    def __init__(self, **model_kwargs):
        super().__init__()
        self.model = SeqTransformer(**model_kwargs)
        self.unused = nn.Linear(4, 4)

    def forward(self, tokens):
        return self.model(tokens)


class FailsToBuild(FaultySeqTransformer):
    """Raises while the model is built on rank `build_fail_rank`: a failure before training starts."""

    def __init__(self, build_fail_rank: int = -1, **model_kwargs):
        if int(os.environ.get("RANK", 0)) == build_fail_rank:
            raise ValueError("injected failure while building the model")
        super().__init__(**model_kwargs)


class HoldAfterCheckpoint(Callback):
    """Holds a run still once its first checkpoint at or after a chosen step is saved, so a test can kill or signal
    it mid-run however slow the machine is: without it, a loaded machine can finish the run before the test's poll
    sees the checkpoint ("the stop came too late").

    Chosen by the environment, not the config, so a held run and its uninterrupted reference share one config.yaml
    (the resume tests compare them): RUNNER_TEST_HOLD="<step>:<dir>". Every rank writes <dir>/held_rank<r> once
    holding, then waits for a stop signal or its death, for at most 300 s."""

    def __init__(self):
        step, _, directory = os.environ.get("RUNNER_TEST_HOLD", "").partition(":")
        self.step, self.directory, self.held = int(step or 0), directory, False
        self.rows_dir = os.environ.get("RUNNER_TEST_ROWS")

    def on_fit_start(self, loop) -> None:
        """With RUNNER_TEST_ROWS=<dir>, every rank appends each training micro-batch's rows (its "source" digits,
        distinct per row) to <dir>/rows_rank<r>.jsonl with the optimizer step it counts towards: the test that
        resumes on another process count rebuilds each global batch from them (read_global_batches)."""
        if not self.rows_dir or getattr(loop, "recording_rows", False):
            return
        loop.recording_rows = True
        train_on = loop.micro_step
        path = Path(self.rows_dir) / f"rows_rank{loop.accelerator.process_index}.jsonl"

        def micro_step(batch):
            rows = ["".join(map(str, row)) for row in batch["source"].tolist()]
            with path.open("a", encoding="utf-8") as file:
                file.write(json.dumps({"step": loop.state.step + 1, "rows": rows}) + "\n")
            return train_on(batch)

        loop.micro_step = micro_step

    def on_save(self, loop, path) -> None:
        if not self.directory or self.held or path is None or loop.state.step < self.step:
            return
        self.held = True
        (Path(self.directory) / f"held_rank{loop.accelerator.process_index}").touch()
        deadline = time.monotonic() + 300
        while loop.stop.received is None and time.monotonic() < deadline:
            time.sleep(0.05)


class SignalDuringEvaluation(SequenceToSequence):
    """SequenceToSequence that sends its own process SIGTERM during its N-th evaluation batch (1-based, counted over
    all evaluations of this process): RUNNER_TEST_SIGNAL_IN_EVAL="<N>" on every rank, "<N>:<rank>" on one. Unset,
    it does nothing, so a reference run shares the config."""

    def __init__(self, **task_kwargs):
        super().__init__(**task_kwargs)
        batch, _, rank = os.environ.get("RUNNER_TEST_SIGNAL_IN_EVAL", "").partition(":")
        this_rank = int(os.environ.get("RANK", 0))
        self.signal_at = int(batch) if batch and (not rank or int(rank) == this_rank) else 0
        self.batches = 0

    def evaluation_stats(self, model, batch):
        self.batches += 1
        if self.batches == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().evaluation_stats(model, batch)


def read_global_batches(rows_dir: Path, processes: int) -> dict[int, list[str]]:
    """The rows of each optimizer step's global batch, in the epoch's order, from what HoldAfterCheckpoint recorded:
    rank r's j-th row of a micro-batch is position r + j * processes of that micro-batch across the ranks
    (runner/data/batches.py deals every processes-th row of the order to each rank)."""
    per_rank = []
    for rank in range(processes):
        steps: dict[int, list[list[str]]] = {}
        for line in (rows_dir / f"rows_rank{rank}.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], []).append(record["rows"])
        per_rank.append(steps)
    batches = {}
    for step in per_rank[0]:
        micro_batches = zip(*(ranks[step] for ranks in per_rank))  # the i-th micro-batch of every rank
        batches[step] = [row for micro in micro_batches for dealt in zip(*micro) for row in dealt]
    return batches
