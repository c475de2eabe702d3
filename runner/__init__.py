"""runner: a config-driven PyTorch experiment runner.

The public names load on first use (PEP 562): `python -m runner` imports this package before its own entry, and
that entry installs the stop-signal handler before torch is imported (seconds), so that a SIGTERM during start-up
ends the run with exit 75, as promised, instead of killing it unreported."""

from __future__ import annotations

import importlib

# name -> the module that defines it
_PUBLIC = {
    "Accelerator": "runner.accelerate.accelerator",
    "set_seed": "runner.accelerate.accelerator",
    "CheckpointConfig": "runner.config",
    "HardwareConfig": "runner.config",
    "LoggingConfig": "runner.config",
    "ParallelConfig": "runner.config",
    "PrecisionConfig": "runner.config",
    "RunConfig": "runner.config",
    "TrainerConfig": "runner.config",
    "DataLoaderConfiguration": "runner.accelerate.options",
    "DistributedType": "runner.accelerate.options",
    "GradientAccumulationPlugin": "runner.accelerate.options",
    "GradScalerKwargs": "runner.accelerate.options",
    "ProjectConfiguration": "runner.accelerate.options",
    "DistributedDataParallelKwargs": "runner.accelerate.parallel",
    "CheckpointError": "runner.errors",
    "ConfigError": "runner.errors",
    "DataError": "runner.errors",
    "HardwareError": "runner.errors",
    "LaunchError": "runner.errors",
    "RunnerError": "runner.errors",
}

__all__ = [
    "Accelerator",
    "DistributedDataParallelKwargs",
    "DataLoaderConfiguration",
    "DistributedType",
    "GradientAccumulationPlugin",
    "GradScalerKwargs",
    "ProjectConfiguration",
    "set_seed",
    "RunConfig",
    "HardwareConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainerConfig",
    "CheckpointConfig",
    "LoggingConfig",
    "RunnerError",
    "ConfigError",
    "DataError",
    "LaunchError",
    "HardwareError",
    "CheckpointError",
]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:  # a submodule (`from runner import config`) is then imported by the import system
        raise AttributeError(f"module 'runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
