"""The batch a run trains with, decided once in the parent from the trainer settings and the process count
(`runner plan OVERRIDES`, runner/commands/plan.py, prints it before a run).

`trainer.batch_size` is the global batch of one optimizer step. Each of the N processes takes batch_size / N
samples of it, split into `grad_accum_steps` micro-batches when a device cannot take its share at once
(`trainer.micro_batch_size`). So learning rate, schedule length and step count do not depend on the hardware:
1 process x 64, 2 x 32 and 4 x 16 take the same 64 samples (the same rows: runner/data/batches.py deals each
step's rows across the ranks) and average the same gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import TrainerConfig
from runner.errors import ConfigError, Problem


@dataclass(frozen=True)
class BatchPlan:
    per_device: int
    """Samples one process draws per micro-batch."""
    accumulation: int
    """Micro-batches per optimizer step."""
    processes: int

    @property
    def global_batch(self) -> int:
        return self.per_device * self.accumulation * self.processes

    def describe(self) -> str:
        return (f"batch: {self.global_batch} global per optimizer step = {self.per_device} per device x "
                f"{self.processes} process(es) x {self.accumulation} accumulation step(s)")


def batch_plan(trainer: TrainerConfig, processes: int) -> BatchPlan:
    problems = batch_problems(trainer, processes)
    if problems:
        raise ConfigError(problems)
    return _plan(trainer, processes)


def batch_problems(trainer: TrainerConfig, processes: int) -> list[Problem]:
    """Why this global batch cannot be shared among `processes` (and micro-batches), or the per-epoch limit cannot
    hold one optimizer step, with what would work."""
    problems = _sharing_problems(trainer, processes)
    limit = trainer.limit_train_batches
    if problems or limit is None or limit < 1:  # below 1: runner/run/checks.py says it must be positive
        return problems
    accumulation = _plan(trainer, processes).accumulation
    if limit < accumulation:
        # Otherwise the epoch would still take a whole step's micro-batches: more than the limit, without a word.
        return [Problem("trainer.limit_train_batches", (
            f"is {limit} micro-batches, fewer than the {accumulation} that one optimizer step accumulates here; "
            f"set it to {accumulation} or more, or lower the accumulation (trainer.grad_accum_steps, "
            "trainer.micro_batch_size)"))]
    return []


def _sharing_problems(trainer: TrainerConfig, processes: int) -> list[Problem]:
    problems = [Problem(f"trainer.{name}", f"is {value}; it must be 1 or more, or null")
                for name, value in (("micro_batch_size", trainer.micro_batch_size),
                                    ("per_device_batch_size", trainer.per_device_batch_size),
                                    ("grad_accum_steps", trainer.grad_accum_steps)) if value is not None and value < 1]
    if problems or trainer.per_device_batch_size is not None:
        return problems
    if trainer.batch_size < 1:
        return [Problem("trainer.batch_size", f"is {trainer.batch_size}; it must be 1 or more")]
    if trainer.batch_size % processes:
        return [Problem("trainer.batch_size", f"is {trainer.batch_size}, the global batch, which {processes} processes "
                                              f"cannot share evenly; use a multiple of {processes} (e.g. "
                                              f"{_multiple(trainer.batch_size, processes)}), or trainer."
                                              "per_device_batch_size for a per-device batch")]
    share, accumulation = trainer.batch_size // processes, trainer.grad_accum_steps
    if accumulation is not None and share % accumulation:
        return [Problem("trainer.grad_accum_steps", f"is {accumulation}, which does not divide the {share} samples "
                                                    f"each of {processes} process(es) takes of trainer.batch_size="
                                                    f"{trainer.batch_size}; use a divisor of {share}")]
    cap = trainer.micro_batch_size
    if accumulation is not None and cap is not None and share // accumulation > cap:
        return [Problem("trainer.micro_batch_size", f"is {cap}, but trainer.grad_accum_steps={accumulation} leaves "
                                                    f"{share // accumulation} samples per micro-batch; raise "
                                                    "grad_accum_steps or leave it null")]
    return []


def _plan(trainer: TrainerConfig, processes: int) -> BatchPlan:
    if trainer.per_device_batch_size is not None:
        return BatchPlan(trainer.per_device_batch_size, trainer.grad_accum_steps or 1, processes)
    share = trainer.batch_size // processes
    accumulation = trainer.grad_accum_steps
    if accumulation is None:
        cap = trainer.micro_batch_size or share
        # The fewest micro-batches of at most `cap` samples that split the share evenly.
        accumulation = next(steps for steps in range(-(-share // cap), share + 1) if share % steps == 0)
    return BatchPlan(share // accumulation, accumulation, processes)


def _multiple(value: int, of: int) -> int:
    return max(of, round(value / of) * of)
