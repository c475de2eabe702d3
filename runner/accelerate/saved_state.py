"""`Accelerator.save_state` / `load_state`, in the runner's checkpoint format (runner/checkpoint/files.py): the
directory is written under `.partial-<name>/`, hashed and fsynced, its manifest written last, then renamed into
place, so it is there whole or not at all and verified before it is loaded.

    state_dir/
      model_0.safetensors   weights of each prepared model, unwrapped (written by the main process)
      state.pt              optimizers, schedulers, scaler, every process's RNG states (weights_only=True)
      manifest.json         layout, world size, each file's size and sha256

Under FSDP (the `dcp` layout) each process writes its shards of every model and optimizer instead
(`.metadata`, `__<rank>_0.distcp`; state.pt then has no optimizers), loadable on another number of processes.

Part of the Accelerator (layer 4, accelerate/): it reads the prepared objects, which runner/checkpoint/ below it
must not know.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from runner.checkpoint import files, sharded
from runner.checkpoint.contents import load_plain_state, load_weights, on_host, save_weights
from runner.checkpoint.files import Layout
from runner.checkpoint.rng import capture_rng, restore_rng
from runner.distributed.dist import all_gather_object, barrier
from runner.errors import CheckpointError
from runner.accelerate import accelerate_dir
from runner.accelerate.parallel import is_sharded
from runner.accelerate.prepared import unwrap_optimizer

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"


@dataclass
class Objects:
    """What an Accelerator prepared, in order."""

    models: list[nn.Module]
    optimizers: list
    schedulers: list
    scaler: torch.amp.GradScaler | None
    sharded: bool
    """parallel=fsdp: the state is saved in shards (from one process too, so that several can load it)."""
    custom: list = field(default_factory=list)
    """register_for_checkpointing's objects: their state_dict() goes into state.pt."""


def save(directory: Path, objects: Objects, world_size: int, is_main: bool) -> Path:
    """Every process: write the state into `directory` (replaced whole if it holds an earlier state)."""
    directory = directory.absolute()
    parent, name = directory.parent, directory.name
    _refuse_foreign(directory)  # on every process (one file system), so none is left waiting for the others
    per_rank = all_gather_object({"rng": capture_rng()})
    state = {"schedulers": [scheduler.state_dict() for scheduler in objects.schedulers],
             "scaler": objects.scaler.state_dict() if objects.scaler is not None else None, "per_rank": per_rank,
             "custom": [_loadable(held) for held in objects.custom]}
    layout = Layout.dcp if objects.sharded else Layout.safetensors
    if layout is Layout.dcp:
        sharded.write(parent, name, _tensors(objects, sharded.model_state, sharded.optimizer_state), is_main,
                      world_size > 1)
        writers = {STATE_FILE: lambda path: torch.save(state, path)}
    else:
        state["optimizers"] = [optimizer.state_dict() for optimizer in objects.optimizers]
        writers = {f"model_{index}.safetensors": (lambda path, model=model: save_weights(model, path))
                   for index, model in enumerate(objects.models)}
        writers[STATE_FILE] = lambda path: torch.save(on_host(state), path)
    if is_main:
        files.write_files(parent, name, writers, fresh=layout is Layout.safetensors)
        manifest = {"step": None, "contents": "accelerator_state", "layout": layout.value, "world_size": world_size,
                    "models": len(objects.models), "optimizers": len(objects.optimizers)}
        files.seal(parent, name, manifest, pointer=False)
    barrier()
    return directory


def load(directory: Path, objects: Objects, rank: int, world_size: int) -> None:
    """Every process: verify `directory` against its manifest, then restore it into the prepared objects. A
    directory Accelerate's save_state wrote is read as Accelerate lays it out (runner/accelerate/accelerate_dir.py)."""
    if not directory.is_dir():
        raise CheckpointError(f"load_state: {directory} {'is a file, not' if directory.exists() else 'is not'} a "
                              f"directory (looked in {directory.absolute().parent}); give a directory written by "
                              "save_state")
    if accelerate_dir.is_accelerate_dir(directory):
        accelerate_dir.load(directory, objects, rank)
        return
    reason = files.damage(directory)
    if reason is not None:
        raise CheckpointError(f"load_state: cannot load {directory}: {reason}; give a directory written by "
                              "save_state")
    manifest = files.read_manifest(directory)
    counts = (len(objects.models), len(objects.optimizers))
    if (manifest["models"], manifest["optimizers"]) != counts:
        raise CheckpointError(f"load_state: {directory} holds {manifest['models']} model(s) and "
                              f"{manifest['optimizers']} optimizer(s), but {counts[0]} and {counts[1]} were prepared; "
                              "prepare the same objects")
    state = load_plain_state(directory / STATE_FILE, "load_state", "Load another directory written by save_state")
    if files.layout_of(manifest) is Layout.dcp:
        sharded.load(directory, _tensors(objects, lambda model: (model, None),
                                         lambda model, optimizer: (model, optimizer)), world_size > 1)
    elif any(is_sharded(model) for model in objects.models):
        raise CheckpointError(f"load_state: {directory} holds whole weights, saved without FSDP, and these models "
                              "are sharded; load it with the parallel setting it was saved with")
    else:
        for index, model in enumerate(objects.models):
            load_weights(directory / f"model_{index}.safetensors", model, "load_state")
        for optimizer, saved in zip(objects.optimizers, state["optimizers"]):
            optimizer.load_state_dict(saved)
    if len(state["schedulers"]) != len(objects.schedulers):
        raise CheckpointError(f"load_state: {directory} holds {len(state['schedulers'])} scheduler(s), but "
                              f"{len(objects.schedulers)} were prepared; prepare the same objects")
    for scheduler, saved in zip(objects.schedulers, state["schedulers"]):
        scheduler.load_state_dict(saved)
    if objects.scaler is not None and state["scaler"] is not None:
        objects.scaler.load_state_dict(state["scaler"])
    custom = state.get("custom", [])
    if len(custom) != len(objects.custom):
        raise CheckpointError(f"load_state: {directory} holds {len(custom)} object(s) registered for checkpointing, "
                              f"but {len(objects.custom)} are registered now; register the same objects")
    for held, saved in zip(objects.custom, custom):
        held.load_state_dict(saved)
    per_rank = state["per_rank"]
    if len(per_rank) != world_size and rank == 0:
        log.warning("load_state: %s was saved by %d process(es), this run has %d; each takes the RNG state of rank "
                    "(its rank mod %d)", directory, len(per_rank), world_size, len(per_rank))
    restore_rng(per_rank[rank % len(per_rank)]["rng"])


def _loadable(held) -> dict:
    """A registered object's state_dict(), checked to load back with weights_only=True (what load_state uses, so a
    checkpoint never runs code): tensors, numbers, strings and containers of them."""
    import io

    state = held.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as err:  # pickle's own errors name the type it refused
        raise CheckpointError(f"save_state: the state_dict() of registered {type(held).__name__} holds something "
                              f"load_state cannot read back safely ({str(err).strip().splitlines()[-1][:200]}); keep "
                              "it to tensors, numbers, strings, lists and dicts (e.g. torch.as_tensor a numpy "
                              "array)") from None
    return state


AUTOMATIC = re.compile(r"checkpoint_(\d+)$")


def automatic_dir(project, caller: str) -> Path:
    """<project_dir>/checkpoints/checkpoint_<iteration>: where save_state() writes when given no directory."""
    from runner.errors import ConfigError, Problem

    if project.total_limit is not None and project.total_limit < 1:
        raise ConfigError(Problem("ProjectConfiguration.total_limit", f"is {project.total_limit}; keep 1 or more "
                                                                       "states, or None for all"))
    if not project.automatic_checkpoint_naming or project.project_dir is None:
        raise ConfigError(Problem(f"{caller}(output_dir)", (
            "no directory given; pass one, or create the Accelerator with project_config=ProjectConfiguration("
            "project_dir=..., automatic_checkpoint_naming=True)")))
    directory = Path(project.project_dir) / "checkpoints" / f"checkpoint_{project.iteration}"
    existing = _numbered(directory.parent) if caller == "save_state" else []
    if existing and existing[-1][0] >= project.iteration:
        # Never replace a state another run saved there, nor write one older than it (total_limit would prune the
        # new one first). Accelerate refuses an existing directory the same way.
        raise CheckpointError(f"save_state: {directory.parent} already holds {existing[-1][1].name}, so "
                              f"checkpoint_{project.iteration} would replace or predate it; continue that run's "
                              "numbering with load_state() first, or set ProjectConfiguration(iteration=N) above it")
    return directory


def number_of(directory: Path) -> int:
    return int(AUTOMATIC.search(directory.name).group(1))


def _numbered(folder: Path) -> list[tuple[int, Path]]:
    found = [(int(match.group(1)), path) for path in folder.glob("checkpoint_*")
             if (match := AUTOMATIC.search(path.name)) and path.is_dir()]
    return sorted(found)


def newest_dir(project) -> Path:
    """The newest intact automatically named state under the project dir (load_state() with no directory)."""
    folder = automatic_dir(project, "load_state").parent
    intact = [path for _, path in _numbered(folder) if files.damage(path) is None]
    if not intact:
        raise CheckpointError(f"load_state: no intact checkpoint_<n> under {folder}; save one with save_state() or "
                              "give the directory to load")
    return intact[-1]


def keep_newest(folder: Path, limit: int) -> None:
    """ProjectConfiguration.total_limit: remove all but the newest `limit` automatically named states."""
    for _, path in _numbered(folder)[:-limit]:
        shutil.rmtree(path, ignore_errors=True)
        log.info("save_state: removed %s (total_limit=%d)", path, limit)


def _tensors(objects: Objects, of_model, of_optimizer) -> dict:
    """model_<i> / optimizer_<j> -> of_model(model) / of_optimizer(its model, optimizer); an optimizer belongs to
    the model that holds its first parameter."""
    entries = {f"model_{index}": of_model(model) for index, model in enumerate(objects.models)}
    for index, prepared in enumerate(objects.optimizers):
        optimizer = unwrap_optimizer(prepared)
        entries[f"optimizer_{index}"] = of_optimizer(_owner(optimizer, objects.models), optimizer)
    return entries


def _owner(optimizer, models: list[nn.Module]) -> nn.Module:
    first = optimizer.param_groups[0]["params"][0]
    for model in models:
        if any(parameter is first for parameter in model.parameters()):
            return model
    raise CheckpointError("save_state: an optimizer's parameters belong to none of the prepared models; prepare "
                          "the model it optimizes with the same Accelerator")


def _refuse_foreign(directory: Path) -> None:
    """An existing directory is replaced whole: only when it is an earlier state, never a folder of other files."""
    if directory.exists() and any(directory.iterdir()) and files.read_manifest(directory) is None:
        raise CheckpointError(f"save_state: {directory} exists and was not written by save_state; it would be "
                              "replaced whole, so give a new directory (or one save_state wrote)")
