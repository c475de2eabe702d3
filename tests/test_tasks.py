"""Tasks: the loss and statistics are those of the flattened logits, whatever shape the model returns."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.tasks import Classification, SequenceToSequence


def test_classification_and_sequence_losses_match_the_flattened_reference():
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
