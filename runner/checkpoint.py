"""Checkpoints: model weights in safetensors, the rest with torch.save, each written atomically.

    checkpoints/
      step_00000120/          one complete checkpoint
        model.safetensors     weights (safe to load: no code runs)
        state.pt              optimizer, scheduler, scaler, step, epoch (loaded with weights_only=True)
      latest                  the name of the newest complete checkpoint

A checkpoint is written under a temporary name, fsynced, then renamed into place, and only then does `latest`
move, so neither a crash nor a full disk leaves `latest` pointing at half a checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from runner.errors import CheckpointError

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
LATEST = "latest"


def _state_of(obj: Any) -> dict | None:
    return obj.state_dict() if obj is not None else None


class Checkpointer:
    """Saves checkpoints into one directory; a disabled one (or one on a non-main rank) saves nothing."""

    def __init__(self, directory: Path, enabled: bool):
        self.directory = directory
        self.enabled = enabled

    def save(self, step: int, epoch: int, model: nn.Module, optimizer, scheduler=None, scaler=None) -> Path | None:
        if not self.enabled:
            return None
        final = self.directory / f"step_{step:08d}"
        partial = self.directory / f".partial-{final.name}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            save_model(model, str(partial / MODEL_FILE))
            state = {
                "step": step,
                "epoch": epoch,
                "optimizer": _state_of(optimizer),
                "scheduler": _state_of(scheduler),
                "scaler": _state_of(scaler),
            }
            torch.save(state, partial / STATE_FILE)
            for path in partial.iterdir():
                _fsync(path)
            if final.exists():
                shutil.rmtree(final)
            os.replace(partial, final)
            _fsync(self.directory)
            _write_atomically(self.directory / LATEST, final.name)
        except OSError as err:
            shutil.rmtree(partial, ignore_errors=True)
            raise CheckpointError(f"checkpoint: could not write {final} ({err}); the previous checkpoint is intact") from err
        return final


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = directory / LATEST
    if not pointer.is_file():
        return None
    return directory / pointer.read_text(encoding="utf-8").strip()


def load_checkpoint(path: Path, model: nn.Module, optimizer=None, scheduler=None, scaler=None) -> dict[str, int]:
    """Restore what `Checkpointer.save` wrote into the given objects; returns {"step", "epoch"}."""
    path = Path(path)
    if path.is_dir() and (path / LATEST).is_file():
        path = latest_checkpoint(path)
    if not (path / MODEL_FILE).is_file() or not (path / STATE_FILE).is_file():
        raise CheckpointError(
            f"resume: '{path}' is not a checkpoint (it needs {MODEL_FILE} and {STATE_FILE}); give a "
            "checkpoints/step_NNNNNNNN directory or a run's checkpoints/ directory"
        )
    try:
        missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=False)
    except RuntimeError as err:
        raise CheckpointError(f"resume: the weights in {path} do not fit this model: {_first_line(err)}") from err
    if missing or unexpected:
        raise CheckpointError(
            f"resume: the weights in {path} do not fit this model: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    state = torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if obj is not None and state.get(key) is not None:
            obj.load_state_dict(state[key])
    return {"step": state["step"], "epoch": state["epoch"]}


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".partial-{path.name}")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
