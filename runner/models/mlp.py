from __future__ import annotations

from typing import Sequence

from torch import nn

from runner.errors import ConfigError, Problem


class MLP(nn.Sequential):
    """Linear layers with ReLU (and optional dropout) between them: in_features -> hidden... -> out_features."""

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (128,), dropout: float = 0.0):
        sizes = {"in_features": in_features, "out_features": out_features,
                 **{f"hidden[{index}]": size for index, size in enumerate(hidden)}}
        problems = [Problem(f"model.{name}", f"is {value}; it must be 1 or more") for name, value in sizes.items()
                    if value < 1]
        if not 0 <= dropout < 1:
            problems.append(Problem("model.dropout", f"is {dropout}; it must be in [0, 1)"))
        if problems:
            raise ConfigError(problems)
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
