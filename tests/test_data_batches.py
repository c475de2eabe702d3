"""TensorBatches: every row once per epoch, disjoint shards, reproducible per-epoch order, rows kept together."""

from __future__ import annotations

import pytest
import torch

from runner.data.batches import TensorBatches


def columns(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(rows)
    return {"id": ids, "features": torch.stack([ids, 10 * ids], dim=1).float()}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_epoch_visits_every_row_once_across_shards(world_size):
    seen = []
    for rank in range(world_size):
        batches = TensorBatches(columns(10), batch_size=3, shuffle=True, seed=0).shard(rank, world_size)
        drawn = list(batches)
        assert len(drawn) == len(batches)
        for batch in drawn:
            assert batch["features"][:, 1].tolist() == (10 * batch["id"]).float().tolist()  # rows stay whole
            seen += batch["id"].tolist()
    assert sorted(seen) == list(range(10))


def test_drop_last_and_batch_sizes():
    sizes = [len(batch["id"]) for batch in TensorBatches(columns(10), 4, shuffle=False, seed=0)]
    assert sizes == [4, 4, 2]
    batches = TensorBatches(columns(10), 4, shuffle=False, seed=0, drop_last=True)
    assert [batch["id"].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(batches) == 2


def test_order_is_reproducible_per_epoch_and_changes_between_epochs():
    def order(epoch: int) -> list[int]:
        batches = TensorBatches(columns(32), 8, shuffle=True, seed=5)
        batches.set_epoch(epoch)
        return torch.cat([batch["id"] for batch in batches]).tolist()

    assert order(0) == order(0) and order(1) == order(1)
    assert order(0) != order(1) and sorted(order(1)) == list(range(32))
