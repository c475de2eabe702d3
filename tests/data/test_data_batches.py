"""TensorBatches: every row once per epoch, disjoint shards, reproducible per-epoch order, rows kept together."""

from __future__ import annotations

import pytest
import torch

from runner.data.batches import TensorBatches


def columns(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(rows)
    return {"id": ids, "features": torch.stack([ids, 10 * ids], dim=1).float()}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_epoch_visits_each_row_once_across_shards(world_size):
    seen = []
    for rank in range(world_size):
        batches = TensorBatches(columns(10), batch_size=3, shuffle=True, seed=0).shard(rank, world_size)
        drawn = list(batches)
        assert len(drawn) == len(batches)
        for batch in drawn:
            assert batch["features"][:, 1].tolist() == (10 * batch["id"]).float().tolist()  # rows stay whole
            seen += batch["id"].tolist()
    # Shuffled (training) shards are padded to equal length, as DistributedSampler does: every row once, and
    # fewer than world_size rows repeated so that every rank takes the same number of steps.
    assert set(seen) == set(range(10)) and len(seen) - 10 < world_size


def test_drop_last_and_batch_sizes():
    sizes = [len(batch["id"]) for batch in TensorBatches(columns(10), 4, shuffle=False, seed=0)]
    assert sizes == [4, 4, 2]
    batches = TensorBatches(columns(10), 4, shuffle=False, seed=0, drop_last=True)
    assert [batch["id"].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(batches) == 2


def test_order_is_reproducible_and_new_each_epoch():
    """The same order for the same epoch, and a different one between epochs."""
    def order(epoch: int) -> list[int]:
        batches = TensorBatches(columns(32), 8, shuffle=True, seed=5)
        batches.set_epoch(epoch)
        return torch.cat([batch["id"] for batch in batches]).tolist()

    assert order(0) == order(0) and order(1) == order(1)
    assert order(0) != order(1) and sorted(order(1)) == list(range(32))


def test_arrow_batches_follow_an_indices_mapping():
    """The batches match the rows of a split reached through an indices mapping."""
    import datasets

    from runner.data.batches import ArrowBatches

    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32"), length=2),
                                  "y": datasets.Value("int64"), "w": datasets.Value("float32")})
    table = datasets.Dataset.from_dict(
        {"x": [[float(i), -float(i)] for i in range(20)], "y": list(range(20)), "w": [0.5 * i for i in range(20)]},
        features=features,
    )
    split = table.train_test_split(test_size=0.25, seed=0)["train"]  # rows reached through an indices mapping
    drawn = list(ArrowBatches(split, 4, shuffle=True, seed=0))
    for batch in drawn:
        assert batch["x"].shape[1] == 2 and batch["y"].dtype == torch.int64 and batch["w"].dtype == torch.float32
        assert batch["x"][:, 0].tolist() == batch["y"].float().tolist() == (2 * batch["w"]).tolist()
    assert sorted(torch.cat([batch["y"] for batch in drawn]).tolist()) == sorted(split["y"])
    assert ArrowBatches(split, 4, shuffle=True, seed=0).shard(1, 2).stand_in()["y"].tolist() == [split["y"][0]]


def test_empty_eval_shard_has_a_stand_in_batch():
    """The stand-in batch is the split's first row."""
    from runner.accelerate.prepared import DeviceBatches

    shard = TensorBatches(columns(1), batch_size=4, shuffle=False, seed=0).shard(1, 2)  # 1 row, 2 processes
    assert list(shard) == [] and len(shard) == 0
    for source in (shard, DeviceBatches(shard, torch.device("cpu"))):
        stand_in = source.stand_in()
        assert stand_in["id"].tolist() == [0] and stand_in["features"].tolist() == [[0.0, 0.0]]
