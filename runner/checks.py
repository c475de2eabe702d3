"""Cross-field checks of a composed config against this machine, run once in the parent before anything starts.

Every problem is collected and reported at once (one ConfigError), each naming its key and what would be valid.
"""

from __future__ import annotations

from runner.build import target_problems
from runner.config import RunConfig
from runner.config import HardwareKind
from runner.devices import CUDA_KINDS, hardware_problems, resolve_kind, select_gpus
from runner.errors import ConfigError, Problem
from runner.precision import precision_problems

POSITIVE_INTS = ("batch_size", "max_epochs", "log_every_steps", "grad_accum_steps", "data_in_memory_mb")
POSITIVE_OR_NONE = ("max_steps", "eval_every_steps", "eval_batch_size", "max_grad_norm")


def check(config: RunConfig) -> None:
    hardware = config.hardware
    problems = trainer_problems(config) + checkpoint_problems(config)
    problems += select_gpus(hardware.kind, config.gpu_ids, hardware.num_processes).problems
    problems += hardware_problems(hardware.kind, hardware.num_processes)
    problems += precision_problems(config.precision.kind, config.precision.fp8_emulation, device_type(hardware.kind))
    problems += target_problems(
        {key: getattr(config, key) for key in ("model", "optimizer", "scheduler", "data", "task")},
        config.allowed_targets,
    )
    if problems:
        raise ConfigError(problems)


def trainer_problems(config: RunConfig) -> list[Problem]:
    trainer, problems = config.trainer, []
    for name in POSITIVE_INTS:
        if getattr(trainer, name) < 1:
            problems.append(Problem(f"trainer.{name}", f"is {getattr(trainer, name)}; it must be 1 or more"))
    for name in POSITIVE_OR_NONE:
        value = getattr(trainer, name)
        if value is not None and value <= 0:
            problems.append(Problem(f"trainer.{name}", f"is {value}; it must be positive, or null to turn it off"))
    if not trainer.monitor.startswith(("val/", "train/")):
        problems.append(
            Problem("trainer.monitor", f"'{trainer.monitor}' is not a logged metric; use val/<name>, e.g. val/accuracy or val/loss")
        )
    if config.hardware.num_processes < 1:
        problems.append(Problem("hardware.num_processes", f"is {config.hardware.num_processes}; it must be 1 or more"))
    return problems


def checkpoint_problems(config: RunConfig) -> list[Problem]:
    settings, problems = config.checkpoint, []
    for name in ("every_n_steps", "keep_last"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            problems.append(Problem(f"checkpoint.{name}", f"is {value}; it must be 1 or more, or null to turn it off"))
    if settings.keep_best < 0:
        problems.append(Problem("checkpoint.keep_best", f"is {settings.keep_best}; it must be 0 (off) or more"))
    if settings.keep_best > 0 and not settings.enabled:
        problems.append(Problem("checkpoint.keep_best", "needs checkpoint.enabled=true"))
    return problems


def device_type(kind: HardwareKind) -> str:
    """The torch device type a hardware choice runs on: cpu, cuda or xla."""
    kind = resolve_kind(kind)
    return "cuda" if kind in CUDA_KINDS else "xla" if kind is HardwareKind.tpu else "cpu"
