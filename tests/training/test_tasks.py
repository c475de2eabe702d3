from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runner.models import MLP, SeqTransformer
from runner.training.tasks import Classification, SequenceToSequence


def test_classification_loss_and_exact_stats():
    model = torch.nn.Identity()
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    batch = {"features": logits, "label": torch.tensor([0, 0, 0])}
    task = Classification()
    assert task.training_loss(model, batch) == pytest.approx(F.cross_entropy(logits, batch["label"]).item())
    stats = task.evaluation_stats(model, batch)
    assert stats["correct"].item() == 2 and stats["count"].item() == 3
    summary = task.summarize(stats)
    assert summary["accuracy"] == pytest.approx(2 / 3)
    assert summary["loss"] == pytest.approx(F.cross_entropy(logits, batch["label"]).item())


def test_batch_stats_sum_to_the_whole_stats():
    torch.manual_seed(0)
    model = MLP(4, 3, hidden=[8])
    data = {"features": torch.randn(10, 4), "label": torch.randint(0, 3, (10,))}
    task = Classification()
    whole = task.summarize(task.evaluation_stats(model, data))
    parts = [task.evaluation_stats(model, {k: v[s] for k, v in data.items()}) for s in (slice(0, 3), slice(3, 10))]
    summed = task.summarize({k: parts[0][k] + parts[1][k] for k in parts[0]})
    assert summed == pytest.approx(whole)


def test_sequence_task_counts_tokens():
    model = SeqTransformer(vocab_size=5, max_len=6, d_model=16, nhead=2, num_layers=1, dim_feedforward=32)
    batch = {"source": torch.randint(0, 5, (3, 6)), "target": torch.randint(0, 5, (3, 6))}
    stats = SequenceToSequence().evaluation_stats(model, batch)
    assert stats["count"].item() == 18
    assert model(batch["source"]).shape == (3, 6, 5)


def test_losses_match_the_flattened_cross_entropy():
    """Classification and sequence losses match the flattened cross-entropy reference."""
    torch.manual_seed(0)
    logits2d, labels = torch.randn(6, 4), torch.randint(0, 4, (6,))
    task = Classification()
    batch = {"features": logits2d, "label": labels}
    assert torch.equal(task.training_loss(lambda x: x, batch), F.cross_entropy(logits2d, labels))
    # Targets of shape (batch, 1) are flattened to (batch,).
    column = {"features": logits2d, "label": labels[:, None]}
    assert torch.equal(task.training_loss(lambda x: x, column), F.cross_entropy(logits2d, labels))

    logits3d, tokens = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    seq = SequenceToSequence()
    expected = F.cross_entropy(logits3d.reshape(-1, 7), tokens.reshape(-1))
    assert torch.equal(seq.training_loss(lambda x: x, {"source": logits3d, "target": tokens}), expected)
    stats = seq.evaluation_stats(lambda x: x, {"source": logits3d, "target": tokens})
    assert stats["count"].item() == 10
    assert stats["correct"].item() == (logits3d.argmax(-1) == tokens).sum().item()


def test_low_precision_logits_give_a_float32_loss():
    logits, labels = torch.randn(3, 4).to(torch.bfloat16), torch.tensor([0, 1, 2])
    loss = Classification().training_loss(lambda x: x, {"features": logits, "label": labels})
    assert loss.dtype == torch.float32


def test_macro_f1_matches_sklearn_over_batches():
    """It sums over batches too."""
    from sklearn.metrics import f1_score

    torch.manual_seed(1)
    logits, labels = torch.randn(50, 4), torch.randint(0, 4, (50,))
    task = Classification()
    parts = [task.evaluation_stats(lambda x: x, {"features": logits[s], "label": labels[s]})
             for s in (slice(0, 20), slice(20, 50))]
    summary = task.summarize({k: parts[0][k] + parts[1][k] for k in parts[0]})
    assert summary["macro_f1"] == pytest.approx(f1_score(labels, logits.argmax(-1), average="macro"))
    assert set(summary) == set(Classification.metric_names)


def test_huggingface_tasks_use_the_models_own_loss():
    transformers = pytest.importorskip("transformers")
    from runner.training.hf_tasks import HuggingFaceCausalLM

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=None, eos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 20, (3, 8))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0  # padding is never a target
    task, batch = HuggingFaceCausalLM(), {"input_ids": ids, "attention_mask": mask}
    loss = task.training_loss(model, batch)
    stats = task.evaluation_stats(model, batch)
    assert stats["count"].item() == 3 * 7 - 3
    assert task.summarize(stats)["loss"] == pytest.approx(loss.item(), rel=1e-5)
