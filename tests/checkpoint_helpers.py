"""Helpers for the in-process checkpoint tests (tests/checkpoint, tests/run/test_rundir.py,
tests/launch/test_worker.py, tests/accelerate/test_saved_state.py): a small trained model and optimizer, the loop's
Checkpointer on a run dir, one save waited for to the end, and what an attacker does to a checkpoint (a payload that
runs a command when unpickled, and a manifest resealed to match)."""

from __future__ import annotations

import json
import pathlib

import torch

from runner.checkpoint import MANIFEST, damage
from runner.checkpoint.files import block_digests, read_manifest
from runner.config import CheckpointConfig, MonitorMode
from runner.models import MLP
from runner.training.checkpointer import Checkpointer

RESOLVED = {"model": {"_target_": "runner.models.MLP", "in_features": 4, "out_features": 3, "hidden": [8]},
            "seed": 0, "resume": None}


def trained_objects(seed: int = 0):
    torch.manual_seed(seed)
    model = MLP(4, 3, hidden=[8])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def checkpointer_in(run_dir, mode=MonitorMode.max, **settings) -> Checkpointer:
    return Checkpointer(run_dir, CheckpointConfig(**settings), writer=True, monitor="val/accuracy",
                        monitor_mode=mode, world_size=1, resolved=RESOLVED)


def save_step(checkpointer, model, optimizer, step, accuracy=None, final=False, global_batch=None):
    """`global_batch`: recorded in the manifest as the loop records it (absent: as in older checkpoints)."""
    metrics = {} if accuracy is None else {"val/accuracy": accuracy}
    position = {"step": step, "epoch": 0, "batch_in_epoch": step}
    if global_batch is not None:
        position.update(samples_in_epoch=step * global_batch, global_batch=global_batch)
    state = {"optimizer": optimizer.state_dict(), "loop": {"step": step}}
    path = checkpointer.save(model, state, position, metrics, final=final)
    checkpointer.wait()  # sealing runs in the background; its errors surface here
    return path


class NotPlainData:
    """Stands for whatever an attacker pickles: a class weights_only=True does not allow."""


def reseal(path):
    """What an attacker with write access does after altering a file: recompute the manifest's sizes and hashes."""
    manifest = read_manifest(path)
    digests = block_digests([path / name for name in manifest["files"]])
    manifest["files"] = {name: {"size": (path / name).stat().st_size, "sha256": digests[path / name]}
                         for name in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert damage(path) is None


class TouchesAFile:
    """Unpickled, it creates `marker`: stands for any command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)
