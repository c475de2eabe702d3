"""A fastText-style text classifier: the mean of the embeddings of a text's tokens and of its token bigrams, then a
linear layer (Joulin et al., "Bag of Tricks for Efficient Text Classification", 2016).

On a few thousand labelled texts it is the first model to try: it trains in seconds, and it matches or beats
TF-IDF with logistic regression, the baseline a user tries first, where a Transformer trained from scratch on so few
texts does not (benchmarks/baselines.py prints the three side by side). Bigrams are hashed into `buckets` rows of
their own, as fastText does, so their count does not grow with the corpus.
"""

from __future__ import annotations

import torch
from torch import nn

from runner.errors import ConfigError, Problem

BIGRAM_HASH = 1_000_003  # a prime: (first * BIGRAM_HASH + second) % buckets spreads the pairs over the rows


class BagOfNgrams(nn.Module):
    """`forward(input_ids)` (batch, length; `pad_id` pads) returns logits (batch, num_classes). Padding takes no part
    in the mean, so a text's prediction does not depend on its batch's longest text."""

    def __init__(self, vocab_size: int, num_classes: int, pad_id: int = 0, dim: int = 64, buckets: int = 65536,
                 dropout: float = 0.0):
        super().__init__()
        problems = [Problem(f"model.{key}", f"is {value}; it must be {least} or more") for key, value, least in
                    (("vocab_size", vocab_size, 1), ("num_classes", num_classes, 2), ("dim", dim, 1),
                     ("buckets", buckets, 0)) if value < least]
        if not 0 <= dropout < 1:
            problems.append(Problem("model.dropout", f"is {dropout}; it must be in [0, 1)"))
        if problems:
            raise ConfigError(problems)
        self.vocab_size, self.buckets, self.pad_id = vocab_size, buckets, pad_id
        self.embed = nn.Embedding(vocab_size + buckets, dim)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids, real = input_ids.long(), input_ids != self.pad_id
        if self.buckets and ids.shape[1] > 1:
            bigrams = self.vocab_size + (ids[:, :-1] * BIGRAM_HASH + ids[:, 1:]) % self.buckets
            ids = torch.cat([ids, bigrams], dim=1)
            real = torch.cat([real, real[:, :-1] & real[:, 1:]], dim=1)
        keep = real.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(ids) * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.head(self.dropout(pooled))
