"""Layer 1, the config: the typed schema (`schema`), instantiating `_target_` nodes behind the allow-list
(`instantiate`, imports Hydra), where configs live (`search_path`) and the command line's group swaps (`groups`).

The face exports the schema only: importing it loads neither Hydra nor torch (`from runner import RunConfig`)."""

from runner.config.schema import (
    ActivationCheckpointingConfig,
    CheckpointConfig,
    CompileConfig,
    HardwareConfig,
    HardwareKind,
    Launcher,
    LoggingConfig,
    MonitorMode,
    NonFinitePolicy,
    ParallelConfig,
    ParallelKind,
    PrecisionConfig,
    PrecisionKind,
    RunConfig,
    RunSpec,
    StartMethod,
    StopSignal,
    TrainerConfig,
    plain,
)

__all__ = [
    "ActivationCheckpointingConfig",
    "CheckpointConfig",
    "CompileConfig",
    "HardwareConfig",
    "HardwareKind",
    "Launcher",
    "LoggingConfig",
    "MonitorMode",
    "NonFinitePolicy",
    "ParallelConfig",
    "ParallelKind",
    "PrecisionConfig",
    "PrecisionKind",
    "RunConfig",
    "RunSpec",
    "StartMethod",
    "StopSignal",
    "TrainerConfig",
    "plain",
]
