"""A task says how a batch becomes a loss (training) and summable statistics (evaluation).

Statistics are sums (of losses, correct predictions, counts) kept on the device, so the loop adds them up across
batches and processes exactly and reads them back once per evaluation, not once per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Stats = dict[str, torch.Tensor]


class Task:
    """Cross-entropy of model(batch[input_key]) against batch[target_key], with loss and accuracy metrics."""

    def __init__(self, input_key: str, target_key: str):
        self.input_key = input_key
        self.target_key = target_key

    def flat_logits_and_targets(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        logits, targets = model(batch[self.input_key]), batch[self.target_key]
        # Reshape only when needed: even a no-op reshape adds a view and an autograd node, ~10 us a step on CPU.
        if logits.dim() != 2:
            logits = logits.reshape(-1, logits.shape[-1])
        return logits, targets if targets.dim() == 1 else targets.reshape(-1)

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, targets = self.flat_logits_and_targets(model, batch)
        return F.cross_entropy(logits if logits.dtype == torch.float32 else logits.float(), targets)

    def evaluation_stats(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Stats:
        logits, targets = self.flat_logits_and_targets(model, batch)
        losses = F.cross_entropy(logits.float(), targets, reduction="none")
        return {
            "loss_sum": losses.sum(dtype=torch.float64),
            "correct": (logits.argmax(-1) == targets).sum(dtype=torch.float64),
            "count": torch.tensor(targets.numel(), device=targets.device, dtype=torch.float64),
        }

    @staticmethod
    def summarize(stats: Stats) -> dict[str, float]:
        count = stats["count"].item()
        return {"loss": stats["loss_sum"].item() / count, "accuracy": stats["correct"].item() / count}


class Classification(Task):
    """One class per sample: logits of shape (batch, classes)."""

    def __init__(self, input_key: str = "features", target_key: str = "label"):
        super().__init__(input_key, target_key)


class SequenceToSequence(Task):
    """One token per position: logits of shape (batch, length, vocab); accuracy is per token."""

    def __init__(self, input_key: str = "source", target_key: str = "target"):
        super().__init__(input_key, target_key)
