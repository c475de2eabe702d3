from __future__ import annotations

from typing import Sequence

from torch import nn


class MLP(nn.Sequential):
    """Linear layers with ReLU (and optional dropout) between them: in_features -> hidden... -> out_features."""

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (128,), dropout: float = 0.0):
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
