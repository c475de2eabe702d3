"""`Accelerator.save_state` / `load_state`: models, optimizers, schedulers, scaler and every process's RNG state.

    state_dir/
      model_0.safetensors   weights of each prepared model, unwrapped (written by the main process)
      state.pt              optimizers, schedulers, scaler (main process; loaded with weights_only=True)
      rng_rank0.pt ...      each process's python, numpy and torch RNG states
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from runner.errors import CheckpointError


def rng_state() -> dict:
    name, keys, position, has_gauss, cached = np.random.get_state()
    # numpy's legacy state holds an ndarray, which weights_only loading refuses: store it as a tensor.
    state = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: Path, models, optimizers, schedulers, scaler, rank: int, is_main: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if is_main:
        for index, model in enumerate(models):
            save_model(model, str(directory / f"model_{index}.safetensors"))
        torch.save(
            {
                "optimizers": [optimizer.state_dict() for optimizer in optimizers],
                "schedulers": [scheduler.state_dict() for scheduler in schedulers],
                "scaler": scaler.state_dict() if scaler is not None else None,
            },
            directory / "state.pt",
        )
    torch.save(rng_state(), directory / f"rng_rank{rank}.pt")


def load(directory: Path, models, optimizers, schedulers, scaler, rank: int) -> None:
    if not (directory / "state.pt").is_file():
        raise CheckpointError(f"load_state: {directory} holds no state.pt; give a directory written by save_state")
    state = torch.load(directory / "state.pt", weights_only=True, map_location="cpu")
    if len(state["optimizers"]) != len(optimizers) or len(state["schedulers"]) != len(schedulers):
        raise CheckpointError(
            f"load_state: {directory} holds {len(state['optimizers'])} optimizer(s) and {len(state['schedulers'])} "
            f"scheduler(s), but {len(optimizers)} and {len(schedulers)} were prepared; prepare the same objects"
        )
    for index, model in enumerate(models):
        load_model(model, str(directory / f"model_{index}.safetensors"))
    for obj, saved in zip([*optimizers, *schedulers], [*state["optimizers"], *state["schedulers"]]):
        obj.load_state_dict(saved)
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    rng_file = directory / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=True))
