"""`Accelerator.save_model`'s directory: a model's weights as `transformers`' `from_pretrained` and
`huggingface_hub.load_torch_model` read them.

    model.safetensors                                  the whole model, when it fits in max_shard_size
    model-00001-of-00003.safetensors, ...              otherwise shards of at most max_shard_size each (a tensor
    model.safetensors.index.json                       larger than that gets a shard of its own), and the index

huggingface_hub decides the split, the names and the index (what Accelerate and transformers use). The writing is
the runner's: huggingface_hub's own save removes the earlier files before it writes the new ones, so a failure
half-way would lose a model the user had. Here every file is written under a temporary name and fsynced, then
renamed into place, the index last; only then are the files of an earlier save that this one does not use removed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from runner.checkpoint import files
from runner.errors import ConfigError, Problem, write_error
from runner.ground import write_text_atomically

WEIGHTS_PATTERN = "model{suffix}.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# What a save in this layout writes, and so what a later save may replace or remove.
OWN_FILES = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")


def plan_shards(weights: dict[str, torch.Tensor], max_shard_size: int | str):
    """huggingface_hub's split of `weights` into files. Every process calls it, with {} where it holds no weights:
    a bad max_shard_size then fails on all of them alike, not on the writer alone while the others wait."""
    from huggingface_hub import split_torch_state_dict_into_shards

    try:
        return split_torch_state_dict_into_shards(weights, filename_pattern=WEIGHTS_PATTERN,
                                                  max_shard_size=max_shard_size)
    except (ValueError, TypeError, AttributeError) as err:
        raise ConfigError(Problem("save_model(max_shard_size)", (
            f"is {max_shard_size!r} ({err}); give a number of bytes or a size such as '5GB', '500MB' or '100KB'"))) \
            from None


def save_weights(weights: dict[str, torch.Tensor], split, directory: Path) -> None:
    """Write `weights` (plain, contiguous tensors sharing no memory) into `directory` as `split` (plan_shards)
    says."""
    from safetensors.torch import save_file

    shards = {name: directory / f"{files.PARTIAL_PREFIX}{name}" for name in split.filename_to_tensors}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, names in split.filename_to_tensors.items():
            save_file({key: weights[key] for key in names}, str(shards[name]), metadata={"format": "pt"})
            files.fsync_path(shards[name])
        for name, temporary in shards.items():
            os.replace(temporary, directory / name)
        if split.is_sharded:  # last: until it moves, an earlier save's index names only its own shards
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            write_text_atomically(directory / INDEX_FILE, json.dumps(index, indent=2),
                                  temporary=directory / f"{files.PARTIAL_PREFIX}{INDEX_FILE}")
    except files.WRITE_ERRORS as err:
        failure = write_error(err, directory, "the model's weights")
        for temporary in shards.values():
            temporary.unlink(missing_ok=True)
        raise failure from err
    written = {*shards, *([INDEX_FILE] if split.is_sharded else [])}
    for stale in directory.iterdir():
        if OWN_FILES.fullmatch(stale.name) and stale.name not in written:
            stale.unlink()
    files.fsync_path(directory)
