"""`export/hf/`: a `transformers` model's final weights in its own `save_pretrained` layout (config.json,
model.safetensors, generation_config.json), so `AutoModel*.from_pretrained("<run dir>/export/hf")` loads it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn

from runner.errors import CheckpointError

HF_EXPORT_DIR = "hf"


def export_pretrained(model: nn.Module, export_dir: Path, state_dict: dict | None = None) -> Path | None:
    """Write `export_dir/hf` for a transformers model (anything else: nothing, None). Whole or not at all: written
    beside it first, then renamed into place. `state_dict`: the whole weights of a sharded model, gathered."""
    if not (hasattr(model, "save_pretrained") and hasattr(model, "config")):
        return None
    target, partial = export_dir / HF_EXPORT_DIR, export_dir / f".{HF_EXPORT_DIR}.partial"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(str(partial), **({"state_dict": state_dict} if state_dict is not None else {}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
    except OSError as err:
        raise CheckpointError(f"checkpoint: exporting the transformers model to {target} failed: {err}") from err
    return target
