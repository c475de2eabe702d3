"""runner: a config-driven PyTorch experiment runner."""

from runner.accelerator import Accelerator, set_seed
from runner.config import (
    CheckpointConfig, HardwareConfig, LoggingConfig, ParallelConfig, PrecisionConfig, RunConfig, TrainerConfig,
)
from runner.options import (
    DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin, GradScalerKwargs, ProjectConfiguration,
)
from runner.parallel import DistributedDataParallelKwargs
from runner.errors import CheckpointError, ConfigError, DataError, HardwareError, LaunchError, RunnerError

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
