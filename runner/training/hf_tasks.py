"""Tasks for HuggingFace `transformers` models: training uses the model's own loss (`outputs.loss`, with `labels`
passed in), evaluation its logits, so the statistics are exact sums like every other task's.

Batches are dicts of tensors; `input_ids` and, when the batch has it, `attention_mask` are passed to the model as
keywords. Padding positions (attention_mask 0) are never targets.
"""

from __future__ import annotations

import torch
from torch import nn

from runner.training.tasks import Classification, LanguageModeling, Stats, class_counts, cross_entropy_stats

IGNORE = -100  # the label transformers' losses skip


class _HuggingFaceTask:
    tokens_per_sample: int | None = None

    def __init__(self, input_key: str = "input_ids", mask_key: str | None = "attention_mask"):
        self.input_key, self.mask_key = input_key, mask_key

    def inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": batch[self.input_key]}
        if self.mask_key and self.mask_key in batch:
            inputs["attention_mask"] = batch[self.mask_key]
        return inputs


class HuggingFaceCausalLM(_HuggingFaceTask):
    """A `*ForCausalLM` model: `labels` are the inputs themselves (the model shifts them by one), padding ignored.
    Reports loss (nats per predicted token), token accuracy and perplexity."""

    metric_names = LanguageModeling.metric_names

    def __init__(self, input_key: str = "input_ids", mask_key: str | None = "attention_mask",
                 tokens_per_sample: int | None = None):
        super().__init__(input_key, mask_key)
        self.tokens_per_sample = tokens_per_sample

    def labels(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if "attention_mask" in inputs:
            return inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, IGNORE)
        return inputs["input_ids"]

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = self.inputs(batch)
        return model(**inputs, labels=self.labels(inputs)).loss

    def evaluation_stats(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Stats:
        inputs = self.inputs(batch)
        logits = model(**inputs).logits[:, :-1]  # position t predicts token t + 1, as the model's own loss counts
        targets = self.labels(inputs)[:, 1:]
        return cross_entropy_stats(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    summarize = staticmethod(LanguageModeling.summarize)


class HuggingFaceClassification(_HuggingFaceTask):
    """A `*ForSequenceClassification` model: one label per sample in `batch[target_key]`. Reports loss, accuracy
    and macro-F1."""

    metric_names = Classification.metric_names

    def __init__(self, input_key: str = "input_ids", mask_key: str | None = "attention_mask", target_key: str = "label"):
        super().__init__(input_key, mask_key)
        self.target_key = target_key

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**self.inputs(batch), labels=batch[self.target_key]).loss

    def evaluation_stats(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Stats:
        logits, targets = model(**self.inputs(batch)).logits, batch[self.target_key]
        return {**cross_entropy_stats(logits, targets), **class_counts(logits, targets)}

    summarize = staticmethod(Classification.summarize)
