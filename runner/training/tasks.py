"""A task says how a batch becomes a loss (training) and summable statistics (evaluation).

Statistics are sums (of losses, correct predictions, counts) kept on the device, so the loop adds them up across
batches and processes exactly and reads them back once per evaluation, not once per step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from runner.errors import ConfigError, first_line

Stats = dict[str, torch.Tensor]
IGNORED_TARGET = -100  # F.cross_entropy's ignore_index: padding and masked positions
# Constructor arguments that size a model's input and output, in the order they are looked for (error hints).
INPUT_SIZE_KEYS = ("in_features", "input_size", "in_channels", "max_len", "vocab_size")
OUTPUT_SIZE_KEYS = ("out_features", "num_classes", "num_labels", "vocab_size")


def _first_key(node: dict, candidates: tuple[str, ...]) -> str | None:
    return next((key for key in candidates if key in (node or {})), None)


class Task:
    """Cross-entropy of model(batch[input_key]) against batch[target_key], with loss and accuracy metrics."""

    metric_names: tuple[str, ...] = ("loss", "accuracy")
    """What `summarize` returns: evaluation logs them as val/<name>, and trainer.monitor may name them."""
    tokens_per_sample: int | None = None
    """Tokens in one sample, when that is fixed: the loop then logs train/tokens_per_s next to samples/s."""

    def __init__(self, input_key: str, target_key: str):
        self.input_key = input_key
        self.target_key = target_key

    def flat_logits_and_targets(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        logits, targets = model(batch[self.input_key]), batch[self.target_key]
        if not isinstance(logits, torch.Tensor):  # a transformers model's output object
            logits = logits.logits
        # Reshape only when needed: even a no-op reshape adds a view and an autograd node, ~10 us a step on CPU.
        if logits.dim() != 2:
            logits = logits.reshape(-1, logits.shape[-1])
        return logits, targets if targets.dim() == 1 else targets.reshape(-1)

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, targets = self.flat_logits_and_targets(model, batch)
        return F.cross_entropy(logits if logits.dtype == torch.float32 else logits.float(), targets)

    def evaluation_stats(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Stats:
        return cross_entropy_stats(*self.flat_logits_and_targets(model, batch))

    def check_fit(self, model: nn.Module, batch: dict[str, torch.Tensor], model_node: dict,
                  data_node: dict | None = None) -> None:
        """One batch through the model before training: a model that cannot take the data, or fewer outputs than
        the data has classes, fails here with the model key to change, not as a traceback at the first step.
        A model on the meta device (runner.run.validate) gets the batch there too: shapes only, no arithmetic.
        `data_node` (the data config) names the user's label column where the data has one (tabular data's
        `label_column` becomes the batches' 'label')."""
        for role, key in (("input_key", self.input_key), ("target_key", self.target_key)):
            if key not in batch:
                raise ConfigError(f"task.{role}", f"'{key}' is not a column of the data's batches; they hold "
                                                  f"{', '.join(batch)}")
        inputs = batch[self.input_key]
        on_meta = any(parameter.is_meta for parameter in model.parameters())
        forward_batch = {key: value.to("meta") for key, value in batch.items()} if on_meta else batch
        try:
            with torch.no_grad():
                logits, _ = self.flat_logits_and_targets(model, forward_batch)
        except (RuntimeError, IndexError, ValueError) as err:
            key = _first_key(model_node, INPUT_SIZE_KEYS)
            hint = f"; model.{key} is {model_node[key]}" if key else ""
            raise ConfigError(f"model.{key}" if key else "model", (
                f"the model cannot take the data's '{self.input_key}' column (a batch of shape {list(inputs.shape)}, "
                f"{inputs.dtype}): {first_line(err)}{hint}; make the model's input size match "
                "the data")) from None
        targets = batch[self.target_key].reshape(-1)
        labels = targets[targets != IGNORED_TARGET]
        classes = logits.shape[-1]
        if labels.numel() and (int(labels.max()) >= classes or int(labels.min()) < 0):
            key = _first_key(model_node, OUTPUT_SIZE_KEYS)
            name = f"model.{key}" if key else "model"
            column = (data_node or {}).get("label_column")
            labels_are = (f"label column '{column}' (data.label_column)" if column else f"'{self.target_key}'")
            raise ConfigError(name, (
                f"is {classes}, but the data's {labels_are} holds class {int(labels.max())} (classes are "
                f"numbered from 0); set {name}={int(labels.max()) + 1} or more"))

    @staticmethod
    def summarize(stats: Stats) -> dict[str, float]:
        count = stats["count"].item()
        return {"loss": stats["loss_sum"].item() / count, "accuracy": stats["correct"].item() / count}


class Classification(Task):
    """One class per sample: logits of shape (batch, classes). Adds macro-F1: the F1 of each class, averaged over the
    classes that occur among the targets or the predictions (scikit-learn's f1_score(average="macro"))."""

    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(self, input_key: str = "features", target_key: str = "label"):
        super().__init__(input_key, target_key)

    def evaluation_stats(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Stats:
        logits, targets = self.flat_logits_and_targets(model, batch)
        return {**cross_entropy_stats(logits, targets), **class_counts(logits, targets)}

    @staticmethod
    def summarize(stats: Stats) -> dict[str, float]:
        return {**Task.summarize(stats), "macro_f1": macro_f1(stats)}


class SequenceToSequence(Task):
    """One token per position: logits of shape (batch, length, vocab); accuracy is per token."""

    def __init__(self, input_key: str = "source", target_key: str = "target"):
        super().__init__(input_key, target_key)


class LanguageModeling(Task):
    """Next-token prediction: logits (batch, length, vocab) against `labels`, the inputs shifted by one (what
    runner.data.text_files yields). Reports loss (nats per token), token accuracy and perplexity = exp(loss)."""

    metric_names = ("loss", "accuracy", "perplexity")

    def __init__(self, input_key: str = "input_ids", target_key: str = "labels", tokens_per_sample: int | None = None):
        super().__init__(input_key, target_key)
        self.tokens_per_sample = tokens_per_sample

    @staticmethod
    def summarize(stats: Stats) -> dict[str, float]:
        summary = Task.summarize(stats)
        return {**summary, "perplexity": math.exp(min(summary["loss"], 700.0))}  # exp(>709) overflows a float


def cross_entropy_stats(logits: torch.Tensor, targets: torch.Tensor) -> Stats:
    """Summed loss, correct predictions and count over the targets that are not ignore_index (-100)."""
    losses = F.cross_entropy(logits.float(), targets, reduction="none")  # 0 where the target is ignored
    counted = targets != IGNORED_TARGET
    return {
        "loss_sum": losses.sum(dtype=torch.float64),
        "correct": ((logits.argmax(-1) == targets) & counted).sum(dtype=torch.float64),
        "count": counted.sum(dtype=torch.float64),
    }


def class_counts(logits: torch.Tensor, targets: torch.Tensor) -> Stats:
    """Per class: true positives, predictions and targets, as sums (they add up exactly over batches and ranks)."""
    classes, predicted = logits.shape[-1], logits.argmax(-1)
    return {
        "class_true_positives": torch.bincount(targets[predicted == targets], minlength=classes).to(torch.float64),
        "class_predicted": torch.bincount(predicted, minlength=classes).to(torch.float64),
        "class_actual": torch.bincount(targets, minlength=classes).to(torch.float64),
    }


def macro_f1(stats: Stats) -> float:
    both = stats["class_predicted"] + stats["class_actual"]  # 2TP + FP + FN per class
    present = both > 0
    return (2 * stats["class_true_positives"][present] / both[present]).mean().item()
