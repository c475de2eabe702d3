"""Sharded checkpoints (parallel=fsdp): torch.distributed.checkpoint (DCP) inside the runner's own discipline.

Every rank writes its shards into the one `.partial-<name>/` rank 0 prepared (DCP adds `.metadata`, written by
rank 0 once every rank's data is on disk, and `__<rank>_0.distcp`); rank 0 then adds its own files and seals the
directory as runner/checkpoint/files.py does for any checkpoint. DCP stores each tensor with its global shape, so
a checkpoint written by N processes loads into M (resharding), or into a plain module in one process.

State dicts come from torch.distributed.checkpoint.state_dict, which names parameters as the module tree does
without the wrappers' parts (`_orig_mod.` of torch.compile, `_checkpoint_wrapped_module.`), and keys optimizer
state by parameter name instead of by position.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import torch
from torch import nn

from runner.checkpoint import files, safe_dcp
from runner.distributed.dist import barrier
from runner.errors import CheckpointError, first_line, write_error


def model_state(model: nn.Module) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter names (an optimizer that never stepped gets its state initialised
    by a step at learning rate 0, so that loading has the tensors to load into)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer)


def write(directory: Path, name: str, state: dict, writer: bool, distributed: bool) -> Path:
    """Every rank: write this rank's shards of `state` into `directory/.partial-<name>/` (rank 0, the `writer`,
    makes it first). A failure on any rank fails on every rank (DCP gathers each rank's outcome); the partial
    directory is then removed and a WriteError raised."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    partial = files.partial_path(directory, name)
    if writer:
        files.start_partial(directory, name)
    barrier()
    try:
        dcp.save(state, checkpoint_id=str(partial), no_dist=not distributed)
    except (OSError, RuntimeError, CheckpointException) as err:
        failure = write_error(_root_cause(err), directory / name, f"the shards of {name}")
        if writer:
            shutil.rmtree(partial, ignore_errors=True)
        raise failure from None
    return partial


def load(path: Path, entries: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]], distributed: bool) -> None:
    """Load `path` (every rank takes its own shards, however many processes wrote it) into each entry: key ->
    (model, None) for a model's weights, (model, optimizer) for that optimizer's state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = {key: optimizer_state(model, optimizer) if optimizer is not None else model_state(model)
             for key, (model, optimizer) in entries.items()}
    reader = safe_dcp.reader(path)  # refuses a .metadata that is not plain DCP metadata, before DCP reads it
    try:
        dcp.load(state, storage_reader=reader, planner=safe_dcp.planner(), no_dist=not distributed)
    except (RuntimeError, ValueError, KeyError, CheckpointException) as err:
        if isinstance(_root_cause(err), pickle.UnpicklingError):  # a non-tensor value that is not plain data
            raise safe_dcp.refusal(path, f"a value in the shards (__<rank>_0.distcp) of {path}",
                                   _one_line(_root_cause(err))) from None
        raise CheckpointError(f"resume: the sharded weights and optimizer state in {path} do not fit this run: "
                              f"{_one_line(_root_cause(err))}") from None
    for key, (model, optimizer) in entries.items():
        if optimizer is None:
            set_model_state_dict(model, state[key])
        else:
            set_optimizer_state_dict(model, optimizer, state[key])


def full_weights(model: nn.Module, distributed: bool) -> dict[str, torch.Tensor]:
    """Every rank: the model's whole weights gathered into one plain state dict on rank 0's CPU (the other ranks
    get {}), contiguous and sharing no memory, as safetensors.torch.save_file wants them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if distributed:
        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        weights = {name: tensor.detach().cpu() for name, tensor in get_model_state_dict(model).items()}
    seen: set[int] = set()
    plain = {}
    for name, tensor in weights.items():
        # Tied weights (one tensor under two names) become two copies: loadable with plain load_state_dict.
        pointer = tensor.data_ptr()
        plain[name] = tensor.clone().contiguous() if pointer in seen else tensor.contiguous()
        seen.add(pointer)
    return plain


def _root_cause(err: BaseException) -> BaseException:
    """DCP wraps each rank's failure in a CheckpointException: the first rank's own exception."""
    failures = getattr(err, "failures", None)
    if failures:
        exception, _traceback = failures[min(failures)]
        return exception
    return err


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err)}"
