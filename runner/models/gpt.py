"""A small decoder-only Transformer language model, the size of nanoGPT's: token + position embeddings, pre-norm
blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and a head tied to the token embedding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from runner.errors import ConfigError


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Flash / memory-efficient kernels where the device has them; is_causal masks the future without a mask tensor.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.proj_dropout(self.proj(y.transpose(1, 2).contiguous().view(batch, length, width)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(), nn.Linear(4 * n_embd, n_embd, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """`forward(input_ids)` of shape (batch, length <= block_size) returns next-token logits (batch, length, vocab).

    `vocab_size` may exceed the tokenizer's (a round number, or the tokenizer's cap): unused ids are never targets,
    and `runner.commands.sample` never draws them.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = False,
        tie_weights: bool = True,
    ):
        super().__init__()
        if n_embd % n_head:
            raise ConfigError("model.n_head", f"{n_head} does not divide model.n_embd={n_embd}; pick a divisor of it")
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, n_embd)
        self.position_embedding = nn.Embedding(block_size, n_embd)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.token_embedding.weight  # one matrix for input and output tokens (GPT-2, nanoGPT)
        self.register_buffer("positions", torch.arange(block_size), persistent=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections into the residual stream: their sum over layers keeps its variance.
        for name, parameter in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.block_size:
            raise ValueError(f"a sequence of {length} tokens is longer than model.block_size={self.block_size}")
        x = self.dropout(self.token_embedding(input_ids) + self.position_embedding(self.positions[:length]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
