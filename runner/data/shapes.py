"""What the data already knows about the model: sizes left null in the model's config, and statistics to fit.

A table's recipe need not restate its column and class counts: `model.in_features: null` becomes the length of the
training split's input column, and `model.out_features: null` (or `num_classes: null`) its number of classes, read
from the split's schema (a fixed-length list column; a ClassLabel column). A text recipe's `model.vocab_size: null`
becomes the number of ids its tokenizer learnt from the training text (80 for the Shakespeare corpus: its 78
characters, <pad> and <unk>, where the tokenizer's cap is 256), so no output row is spent on an id no text has.
Standardize layers in the model take the mean and spread of the training split's inputs, once, before training;
they are buffers, so checkpoints and the export carry them and inference standardises the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runner.errors import ConfigError

# model key -> what of the data fills it
SIZE_KEYS = {"in_features": "features", "out_features": "classes", "num_classes": "classes",
             "vocab_size": "vocabulary"}


def sizes_wanted(model_node: dict[str, Any]) -> list[str]:
    """The model's size keys left null for the data to fill."""
    if not isinstance(model_node, dict):
        return []
    return [key for key in SIZE_KEYS if key in model_node and model_node[key] is None]


def fill_from_data(model_node: dict[str, Any], train, task_node: dict[str, Any] | None) -> dict[str, Any]:
    """The model node with its null sizes filled from the training split (unchanged when none is null)."""
    wanted = sizes_wanted(model_node)
    if not wanted:
        return model_node
    input_key, target_key = _keys(task_node)
    known = data_sizes(train, input_key, target_key)
    filled = dict(model_node)
    for key in wanted:
        what = SIZE_KEYS[key]
        if what == "vocabulary":  # no column holds it: the split was read through a tokenizer, or it says nothing
            lacks = ("only text read through a tokenizer (data=text_files, data=text_classification) knows its "
                     "vocabulary")
        else:
            column = input_key if what == "features" else target_key
            columns = list(getattr(train, "features", None) or {})
            if columns and column not in columns:
                role = "task.input_key" if what == "features" else "task.target_key"
                raise ConfigError(role, f"'{column}' is not a column of the data; it holds {', '.join(columns)}")
            lacks = (f"the training split's '{column}' column "
                     + ("is not a fixed-length list of numbers" if what == "features"
                        else "has no class names (not a ClassLabel)"))
        if what not in known:
            raise ConfigError(f"model.{key}", f"is null, so the data should say it, but {lacks}; "
                                              f"set model.{key} to a number")
        filled[key] = known[what]
    return filled


def data_sizes(train, input_key: str = "features", target_key: str = "label") -> dict[str, int]:
    """Feature and class counts a split's schema states (a datasets.Dataset; others say nothing), and the
    vocabulary of a split read through a tokenizer."""
    import datasets

    sizes = {}
    if getattr(train, "vocab_size", None):
        sizes["vocabulary"] = train.vocab_size
    schema = getattr(train, "features", None)
    if not isinstance(schema, datasets.Features):
        return sizes
    length = getattr(schema.get(input_key), "length", None) or 0  # -1: a list of any length
    if length > 0:
        sizes["features"] = length
    if isinstance(schema.get(target_key), datasets.ClassLabel):
        sizes["classes"] = schema[target_key].num_classes
    return sizes


def fit_statistics(model: nn.Module, train, task_node: dict[str, Any] | None) -> None:
    """Fit every Standardize layer of the model to the training split's inputs (a resumed run then loads the
    same values from its checkpoint)."""
    layers = [module for module in model.modules() if isinstance(module, Standardize)]
    if not layers or any(buffer.is_meta for buffer in model.buffers()):
        return
    input_key, _ = _keys(task_node)
    if input_key not in getattr(train, "column_names", ()):
        return  # the task's check before the first step names the missing column
    inputs = train.with_format("torch", columns=[input_key])[:][input_key]
    if not isinstance(inputs, torch.Tensor):
        return  # ragged inputs: nothing per-feature to standardise (make_batches names the column)
    inputs = inputs.to(torch.float64).reshape(len(inputs), -1)
    for layer in layers:
        if layer.mean.numel() == inputs.shape[1]:  # else the check before the first step names model.in_features
            layer.fit(inputs)


def _keys(task_node: dict[str, Any] | None) -> tuple[str, str]:
    task_node = task_node or {}
    return task_node.get("input_key", "features"), task_node.get("target_key", "label")


class Standardize(nn.Module):
    """(x - mean) / std per feature, with the training split's statistics (fit_statistics sets them). A constant
    feature keeps std 1, so it becomes 0 rather than NaN."""

    def __init__(self, num_features: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(num_features))
        self.register_buffer("std", torch.ones(num_features))

    def fit(self, inputs: torch.Tensor) -> None:
        std = inputs.std(dim=0, unbiased=False)
        self.mean.copy_(inputs.mean(dim=0))
        self.std.copy_(torch.where(std > 1e-12, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
