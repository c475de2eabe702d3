"""Loading a sharded (DCP) checkpoint without running anything it holds.

torch.distributed.checkpoint keeps two kinds of pickles in a checkpoint: `.metadata` (read with plain
`pickle.load` by FileSystemReader) and each non-tensor value (read with `torch.load(weights_only=False)` by
DefaultLoadPlanner). Either runs whatever code an altered file names, before any of the runner's checks. Here
`.metadata` is read by an unpickler that builds only DCP's own metadata classes and plain data, and non-tensor
values go through torch's weights-only unpickler; anything else is refused with a message naming the file. The
tensors themselves DCP already reads with weights_only=True.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

from runner.errors import CheckpointError, first_line

METADATA_FILE = ".metadata"

# What DCP (torch 2.13) pickles into `.metadata`, found by loading real FSDP checkpoints with a find_class that
# records every global: its metadata dataclasses, the file-offset record, and the torch values they hold.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a lookup of torch.strided & co by name, as weights_only allows
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},  # storage_meta's id
    "builtins": {"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bool",
                 "bytearray"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes above, torch dtypes and memory formats; any other global is an UnpicklingError."""

    def find_class(self, module: str, name: str):
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
                return value
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not DCP metadata")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not DCP metadata")


def refusal(checkpoint: Path, what: str, reason: str) -> CheckpointError:
    """The one message for a sharded checkpoint whose pickles (`what`: the file) name something the runner will
    not build."""
    older = sorted(path for path in checkpoint.parent.glob("step_*") if path.is_dir() and path.name < checkpoint.name)
    instead = (f"resume=<run dir>/checkpoints/{older[-1].name}, the one before it" if older
               else "another run's checkpoint, or start a new run")
    return CheckpointError(
        f"resume: {what} holds code or objects the runner will not load ({reason}); DCP checkpoints the runner "
        "writes hold only tensors, their shapes and plain values, so it was altered after it was written or not "
        f"written by the runner. Nothing in it was run. Resume from {instead}; do not trust this checkpoint")


def read_metadata(checkpoint: Path):
    """The Metadata in `checkpoint/.metadata`, built by the restricted unpickler (a CheckpointError if it holds
    anything else or cannot be parsed)."""
    file = checkpoint / METADATA_FILE
    try:
        with open(file, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except OSError as err:
        raise CheckpointError(f"resume: cannot read {file}: {err.strerror or err}") from None
    except Exception as err:  # UnpicklingError for a refused global; anything else for a garbled file
        raise refusal(checkpoint, str(file), f"{type(err).__name__}: {first_line(err)}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise refusal(checkpoint, str(file), f"a {type(metadata).__name__} where DCP's Metadata belongs")
    return metadata


def reader(checkpoint: Path):
    """A FileSystemReader for `checkpoint` whose metadata is the safely read one."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    metadata = read_metadata(checkpoint)

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            # What FileSystemReader.read_metadata does after its pickle.load.
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(checkpoint))


def planner():
    """DCP's default load planner, but non-tensor values (optimizer hyperparameters) are read weights-only: its
    load_bytes as in torch 2.13, with weights_only=False turned to True."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.planner import ReadItem

    class WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return WeightsOnlyPlanner()
