from __future__ import annotations

from runner.config import PrecisionKind
from runner.ground import flatten_hparams


def test_flatten_hparams_makes_dotted_scalars():
    flat = flatten_hparams(
        {"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "scheduler": None, "precision": {"kind": PrecisionKind.bf16},
         "trainer": {"progress_bar": True, "max_steps": 3}}
    )
    assert flat == {
        "optimizer.lr": 0.1, "optimizer.betas": "[0.9, 0.99]", "scheduler": "None", "precision.kind": "bf16",
        "trainer.progress_bar": True, "trainer.max_steps": 3,
    }
