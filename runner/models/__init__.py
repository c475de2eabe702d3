"""Small built-in models for the recipes. Any torch.nn.Module with a `_target_` works the same way."""

from runner.models.gpt import GPT
from runner.models.mlp import MLP
from runner.models.seq_transformer import SeqTransformer

__all__ = ["GPT", "MLP", "SeqTransformer"]
