from __future__ import annotations

import torch
from torch import nn


class TextClassifier(nn.Module):
    """A Transformer encoder over token ids, mean-pooled over the real tokens, then a linear classifier.

    `forward(input_ids)` (batch, length) returns logits (batch, num_classes); padding (`pad_id`) is masked out of the
    attention and of the pooling, so a text's prediction does not depend on how long its batch's longest text is.
    """

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, d_model: int = 128,
                 nhead: int = 4, num_layers: int = 2, dim_feedforward: int = 256, dropout: float = 0.1):
        super().__init__()
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.position = nn.Parameter(torch.randn(max_length, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        padding = input_ids == self.pad_id
        hidden = self.encoder(self.embed(input_ids) + self.position[: input_ids.shape[1]], src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)
        pooled = (self.norm(hidden) * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.head(pooled)
