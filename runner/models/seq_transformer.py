from __future__ import annotations

import torch
from torch import nn


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
