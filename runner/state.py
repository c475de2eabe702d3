"""`Accelerator.save_state` / `load_state`: models, optimizers, schedulers, scaler and every process's RNG state.

    state_dir/
      model_0.safetensors   weights of each prepared model, unwrapped (written by the main process)
      state.pt              optimizers, schedulers, scaler (main process; loaded with weights_only=True)
      rng_rank0.pt ...      each process's python, numpy and torch RNG states
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from runner.checkpoint.rng import capture_rng, restore_rng
from runner.errors import CheckpointError


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
    torch.save(capture_rng(), directory / f"rng_rank{rank}.pt")


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
        restore_rng(torch.load(rng_file, weights_only=True))
