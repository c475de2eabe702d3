from __future__ import annotations

from typing import Sequence

from torch import nn

from runner.data.shapes import Standardize
from runner.errors import ConfigError, Problem


class MLP(nn.Sequential):
    """Linear layers with ReLU (and optional dropout) between them: in_features -> hidden... -> out_features.

    standardize=True puts a Standardize layer first: each feature shifted and scaled by the training split's mean
    and standard deviation (fitted before training, kept in the weights, so the export standardises too). Left
    null (the mlp group's default), in_features and out_features come from the data (runner/data/shapes.py)."""

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (128,), dropout: float = 0.0,
                 standardize: bool = False):
        sizes = {"in_features": in_features, "out_features": out_features,
                 **{f"hidden[{index}]": size for index, size in enumerate(hidden)}}
        problems = [Problem(f"model.{name}", "is null and nothing filled it; set it to a number") for name, value in
                    sizes.items() if value is None]
        problems += [Problem(f"model.{name}", f"is {value}; it must be 1 or more") for name, value in sizes.items()
                     if value is not None and value < 1]
        if not 0 <= dropout < 1:
            problems.append(Problem("model.dropout", f"is {dropout}; it must be in [0, 1)"))
        if problems:
            raise ConfigError(problems)
        layers: list[nn.Module] = [Standardize(in_features)] if standardize else []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
