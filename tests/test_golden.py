"""Golden losses: the default recipe on 640 generated rows, seed 0, recorded once (torch 2.13, CPU) and compared
with a tolerance on 1 and 2 processes, so a change that shifts every run alike (initialisation, data order, the
loss, the schedule) is caught even though the runs still agree with each other."""

from __future__ import annotations

import pytest

from conftest import read_scalars

GOLDEN = ("data.num_train=640", "data.num_validation=64", "trainer.batch_size=32", "trainer.max_steps=40",
          "trainer.log_every_steps=10", "trainer.eval_every_steps=20", "trainer.progress_bar=false")
TRAIN_LOSS = [2.44237, 2.34033, 2.21985, 2.14794]  # at steps 10, 20, 30, 40
VAL_LOSS = [2.27969, 2.11237]  # at steps 20, 40
# Relative: summation order differs between 1 and 2 processes (1e-7 here) and between CPU kernels (AVX2, AVX-512).
TOLERANCE = 1e-3


@pytest.mark.parametrize("hardware", [("hardware=cpu",), ("hardware=multi_cpu", "hardware.start_method=fork")],
                         ids=["1 process", "2 processes"])
def test_the_default_recipe_still_learns_exactly_as_recorded(cli, hardware):
    result = cli(*GOLDEN, *hardware)
    assert result.returncode == 0, result.output
    train = read_scalars(result.run_dir(), "train/loss")
    assert [step for step, _ in train] == [10, 20, 30, 40]
    assert [value for _, value in train] == pytest.approx(TRAIN_LOSS, rel=TOLERANCE)
    assert [value for _, value in read_scalars(result.run_dir(), "val/loss")] == pytest.approx(VAL_LOSS, rel=TOLERANCE)
