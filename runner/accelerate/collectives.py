"""The Accelerator's data-sharing helpers over nested structures (a tensor, or dicts/lists/tuples of them), as
Accelerate documents them: `split_between_processes`, `pad_across_processes`, `gather_for_metrics`.

The collectives themselves are runner/distributed/dist.py's; each refuses to act locally when several processes
have no group.
"""

from __future__ import annotations

from typing import Any

import torch

from runner.distributed import dist
from runner.accelerate.prepared import tree_map


def share(length: int, num_processes: int, process_index: int) -> tuple[int, int]:
    """[start, end) of this process's items of `length`: as even as possible, the first ones one more."""
    per, extra = divmod(length, num_processes)
    start = process_index * per + min(process_index, extra)
    return start, start + per + (process_index < extra)


def split(inputs: Any, num_processes: int, process_index: int, apply_padding: bool = False) -> Any:
    """This process's part of `inputs` (a list, tuple, tensor, dict of them, or anything sliceable such as a
    datasets.Dataset). `apply_padding`: lists, tuples and tensors are completed to as many items on every
    process, lists repeating their own last item, tensors the input's last row (Accelerate's rules)."""
    if isinstance(inputs, dict):
        lengths = {len(value) for value in inputs.values()}
        if len(lengths) > 1:
            from runner.errors import ConfigError, Problem

            raise ConfigError(Problem("split_between_processes(inputs)", (
                f"got a dict whose values have different lengths {sorted(lengths)}; every value is split at the "
                "same points, so give values of one length")))
        return {key: split(value, num_processes, process_index, apply_padding) for key, value in inputs.items()}
    if num_processes == 1:
        return inputs
    start, end = share(len(inputs), num_processes, process_index)
    if hasattr(inputs, "select") and hasattr(inputs, "column_names"):  # a datasets.Dataset: slicing gives a dict
        rows = list(range(min(start, len(inputs) - 1), min(end, len(inputs))) or [len(inputs) - 1])
        most = -(-len(inputs) // num_processes)
        return inputs.select(rows + [rows[-1]] * (most - len(rows)) if apply_padding else rows)
    # A process with nothing left gets the last item (Accelerate does the same), so no process gets nothing.
    part = inputs[start:end] if start < len(inputs) else inputs[-1:]
    missing = -(-len(inputs) // num_processes) - len(part)
    if not apply_padding or missing <= 0:
        return part
    if isinstance(part, torch.Tensor):  # completed with the input's last row, as Accelerate pads with it
        return torch.cat([part, inputs[-1:].expand(missing, *part.shape[1:])])
    if isinstance(part, (list, tuple)):
        return part + type(part)([part[-1]] * missing)
    return part


def pad(tensors: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Each tensor padded with `pad_index` along `dim` to the largest size any process has there."""
    def padded(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0:
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        most = int(dist.all_reduce(size, "max").item())
        if most == tensor.shape[dim]:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = most
        out = tensor.new_full(shape, pad_index)
        place = [slice(None)] * tensor.dim()
        place[dim] = slice(most - tensor.shape[dim], most) if pad_first else slice(0, tensor.shape[dim])
        out[tuple(place)] = tensor
        return out

    return tree_map(padded, tensors)


def _only_tensors(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return all(_only_tensors(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return len(obj) > 0 and all(_only_tensors(value) for value in obj)
    return False


def gather_for_metrics(data: Any, real: int | None, use_gather_object: bool = False) -> Any:
    """Every process's `data`, each first cut to its `real` samples (the repeats that completed the last global
    batch dropped): tensors concatenated in rank order, anything else gathered as objects (lists flattened)."""
    if use_gather_object or not _only_tensors(data):
        if real is not None and isinstance(data, (list, tuple)):
            data = data[:real]
        parts = dist.all_gather_object(data)
        if all(isinstance(part, (list, tuple)) for part in parts):
            return [item for part in parts for item in part]
        return parts
    if real is not None:
        data = tree_map(lambda tensor: tensor[:real] if tensor.dim() else tensor, data)
    return tree_map(dist.all_gather_cat, data)
