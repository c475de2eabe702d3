"""`load_state(dir)` of a directory Accelerate's `save_state` wrote: a project switching to the runner mid-training
continues from its last Accelerate checkpoint.

Accelerate's files (accelerate/checkpointing.py, save_accelerator_state): `model.safetensors`, `model_1.safetensors`
... (or `pytorch_model.bin`, `pytorch_model_1.bin` with safe_serialization=False), `optimizer.bin`,
`optimizer_1.bin` ..., `scheduler.bin` ..., `scaler.pt`, `random_states_<process>.pkl`,
`custom_checkpoint_<i>.pkl`. All but the safetensors files are pickles. Each is read with
`torch.load(weights_only=True)`, which builds only tensors, numbers, strings and containers of them, with numpy's
array rebuilding allowed by name for the RNG states: anything else in the file is refused, naming it, and nothing
in it runs. Restored: every model, optimizer, scheduler, the grad scaler, the objects registered for checkpointing,
and this process's Python, numpy and torch random generators.
"""

from __future__ import annotations

import logging
import pickle
import random
from pathlib import Path

import numpy as np
import torch

from runner.checkpoint.contents import load_weights
from runner.checkpoint.files import MANIFEST
from runner.errors import CheckpointError

log = logging.getLogger(__name__)

RNG_FILE = "random_states_{}.pkl"


def is_accelerate_dir(directory: Path) -> bool:
    """Written by Accelerate's save_state (not the runner's, whose manifest seals it)."""
    return not (directory / MANIFEST).is_file() and (directory / RNG_FILE.format(0)).is_file()


def load(directory: Path, objects, rank: int) -> None:
    """Restore an Accelerate save_state directory into the prepared `objects` (saved_state.Objects)."""
    _count(directory, ("model*.safetensors", "pytorch_model*.bin"), len(objects.models), "model(s)")
    _count(directory, ("optimizer*.bin",), len(objects.optimizers), "optimizer(s)")
    _count(directory, ("scheduler*.bin",), len(objects.schedulers), "scheduler(s)")
    _count(directory, ("custom_checkpoint_*.pkl",), len(objects.custom), "object(s) registered for checkpointing")
    for index, model in enumerate(objects.models):
        suffix = f"_{index}" if index else ""
        weights = directory / f"model{suffix}.safetensors"
        if weights.is_file():
            load_weights(weights, model, "load_state")
        else:
            _load_into(model, read(directory / f"pytorch_model{suffix}.bin"), directory / f"pytorch_model{suffix}.bin")
    for kind, held in (("optimizer", objects.optimizers), ("scheduler", objects.schedulers)):
        for index, obj in enumerate(held):
            path = directory / (f"{kind}.bin" if index == 0 else f"{kind}_{index}.bin")
            _load_into(obj, read(path), path)
    if objects.scaler is not None and (directory / "scaler.pt").is_file():
        _load_into(objects.scaler, read(directory / "scaler.pt"), directory / "scaler.pt")
    for index, held in enumerate(objects.custom):
        path = directory / f"custom_checkpoint_{index}.pkl"
        _load_into(held, read(path), path)
    _restore_rng(directory, rank)


def read(path: Path):
    """A pickle of Accelerate's, as plain data only (see the module's docstring)."""
    if not path.is_file():
        raise CheckpointError(f"load_state: {path} is missing; the directory is not a complete Accelerate "
                              "save_state directory")
    allowed = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"load_state: {path} holds objects other than tensors, numbers, strings and containers "
            f"({str(err).splitlines()[-1].strip() or 'UnpicklingError'}): it was not loaded, since unpickling it "
            "could run code. Accelerate writes only such data into it; it was altered, or not written by "
            "Accelerate's save_state") from None


def _load_into(obj, state, path: Path) -> None:
    try:
        obj.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"load_state: {path} does not fit the prepared {type(obj).__name__}: "
                              f"{str(err).splitlines()[0]}") from None


def _count(directory: Path, patterns: tuple[str, ...], prepared: int, what: str) -> None:
    found = sorted({path.name for pattern in patterns for path in directory.glob(pattern)})
    if len(found) != prepared:
        raise CheckpointError(f"load_state: {directory} holds {len(found)} {what} ({', '.join(found) or 'none'}), "
                              f"but {prepared} were prepared; prepare the same objects, in the same order")


def _restore_rng(directory: Path, rank: int) -> None:
    path = directory / RNG_FILE.format(rank)
    if not path.is_file():
        log.warning("load_state: %s is missing (saved by fewer processes?); process %d takes process 0's random "
                    "state", path.name, rank)
        path = directory / RNG_FILE.format(0)
    states = read(path)
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if torch.cuda.is_available() and "torch_cuda_manual_seed" in states:
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])
