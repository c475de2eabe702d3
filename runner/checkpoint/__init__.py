"""Layer 3, checkpoints you can trust on disk: atomic writes with a verified manifest, sealing, finding the newest
intact one and the resume point. No training knowledge: what goes into a checkpoint and which are kept is the
loop's checkpointer (runner/training/checkpointer.py), the Accelerator's save_state is runner/accelerate/saved_state.py.

`files` owns the on-disk format, `contents` reads what a checkpoint holds (for resume and load_state alike),
`sharded` and `safe_dcp` the DCP layout, `resume` which one to load, `remote` the copies on object storage
(checkpoint.dir), `rng` the random generators' state, `model_dir` and `hf_export` the exported model folders.
"""

from runner.checkpoint.files import LATEST, MANIFEST, complete_checkpoints, damage, newest_complete_step, read_pointer
from runner.checkpoint.resume import AUTO, find_resume, refuse_inexact_resume

__all__ = [
    "AUTO", "LATEST", "MANIFEST", "complete_checkpoints", "damage", "find_resume", "newest_complete_step",
    "read_pointer", "refuse_inexact_resume",
]
