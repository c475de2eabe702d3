"""Checkpoints you can trust: atomic writes with a verified manifest, exact resume, retention and export.

`files` owns the on-disk format, `checkpointer` what goes in and what is kept, `resume` which one to load,
`rng` the random generators' state.
"""

from runner.checkpoint.checkpointer import (
    CONFIG_FILE,
    EXPORT_DIR,
    MODEL_FILE,
    STATE_FILE,
    Checkpointer,
    apply_rng,
    config_hash,
    restore,
)
from runner.checkpoint.files import LATEST, MANIFEST, complete_checkpoints, damage, newest_complete_step, read_pointer
from runner.checkpoint.resume import AUTO, find_resume, refuse_another_world_size

__all__ = [
    "AUTO", "CONFIG_FILE", "EXPORT_DIR", "LATEST", "MANIFEST", "MODEL_FILE", "STATE_FILE", "Checkpointer",
    "apply_rng", "complete_checkpoints", "config_hash", "damage", "find_resume", "newest_complete_step", "read_pointer",
    "refuse_another_world_size", "restore",
]
