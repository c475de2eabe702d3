"""runner: a config-driven PyTorch experiment runner."""

from runner.accelerator import Accelerator, set_seed
from runner.config import CheckpointConfig, HardwareConfig, LoggingConfig, PrecisionConfig, RunConfig, TrainerConfig
from runner.errors import CheckpointError, ConfigError, DataError, HardwareError, LaunchError, RunnerError

__all__ = [
    "Accelerator",
    "set_seed",
    "RunConfig",
    "HardwareConfig",
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
