from __future__ import annotations

import torch
from torch import nn

from runner.errors import ConfigError, Problem


def _divisors(number: int) -> str:
    return ", ".join(str(d) for d in range(1, number + 1) if number % d == 0)


class SeqTransformer(nn.Module):
    """A token-to-token Transformer encoder: embeds a sequence, encodes it, predicts one token per position.

    Enough for sequence tasks whose output has the input's length (reverse, sort), without a decoder.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.0,
    ):
        super().__init__()
        problems = [Problem(f"model.{name}", f"is {value}; it must be 1 or more") for name, value in
                    (("vocab_size", vocab_size), ("max_len", max_len), ("d_model", d_model), ("nhead", nhead),
                     ("num_layers", num_layers), ("dim_feedforward", dim_feedforward)) if value < 1]
        if not problems and d_model % nhead:
            problems.append(Problem("model.nhead", f"is {nhead}, which does not divide model.d_model={d_model} (each "
                                    f"head gets d_model / nhead features); use one of {_divisors(d_model)}"))
        if not 0 <= dropout < 1:
            problems.append(Problem("model.dropout", f"is {dropout}; it must be in [0, 1)"))
        if problems:
            raise ConfigError(problems)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True
        )
        # Nested tensors only help with padding masks, which we do not use; turning them off avoids a warning.
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(hidden)))
