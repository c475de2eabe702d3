from __future__ import annotations

import os
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch

from runner.data import ArrowBatches, TensorBatches, digit_sequences, local_files, make_batches, sklearn_digits
from runner.errors import ConfigError, DataError


def test_digit_sequences_reverse_and_sort():
    reversed_ = digit_sequences("reverse", num_train=50, num_validation=10, seq_len=5, seed=7)
    row = reversed_["train"][0]
    assert row["target"] == row["source"][::-1]
    assert len(reversed_["train"]) == 50 and len(reversed_["validation"]) == 10
    assert reversed_["train"]["source"] != reversed_["validation"]["source"][:10]
    sorted_ = digit_sequences("sort", num_train=20, num_validation=5, seq_len=6, seed=7)
    assert all(row["target"] == sorted(row["source"]) for row in sorted_["train"])


def test_digit_sequences_are_seeded_and_in_memory(tmp_path, monkeypatch):
    """Deterministic per seed and written nowhere: no cache files."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    first = digit_sequences("reverse", num_train=40, num_validation=8, seq_len=4, seed=3)
    second = digit_sequences("reverse", num_train=40, num_validation=8, seq_len=4, seed=3)
    assert first["train"]["source"] == second["train"]["source"]
    assert first["validation"]["target"] == second["validation"]["target"]
    other = digit_sequences("reverse", num_train=40, num_validation=8, seq_len=4, seed=4)
    assert other["train"]["source"] != first["train"]["source"]
    assert first["train"].cache_files == [] and list(tmp_path.iterdir()) == []  # in memory: no cache to go stale
    # The same rows as numpy's generator gives for that seed (what the golden losses were recorded on).
    expected = np.random.default_rng(3).integers(0, 10, size=(40, 4), dtype=np.int64)
    assert first["train"]["source"] == expected.tolist()
    assert first["train"].features["source"] == datasets.Sequence(datasets.Value("int64"), length=4)


def test_unknown_operation_names_the_key():
    with pytest.raises(ConfigError, match="data.operation: 'rotate' is not an operation; choose one of reverse, sort"):
        digit_sequences("rotate")


@pytest.fixture
def table(tmp_path):
    rows = ["x,y,kind"] + [f"{i},{i * 2},{'ab'[i % 2]}" for i in range(20)]
    path = tmp_path / "table.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_local_csv_packs_features_and_encodes_labels(table):
    splits = local_files(str(table), label_column="kind", validation_fraction=0.25, seed=0)
    assert len(splits["train"]) == 15 and len(splits["validation"]) == 5
    assert splits["train"].column_names == ["features", "label"]
    for row in splits["train"]:
        x, y = row["features"]
        assert y == 2 * x
        assert row["label"] == int(x) % 2  # "a" -> 0, "b" -> 1, the same in both splits


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_local_parquet_and_json(tmp_path, suffix):
    import pandas as pd

    frame = pd.DataFrame({"f1": [0.0, 1.0, 2.0, 3.0], "f2": [1.0, 1.0, 0.0, 0.0], "label": [0, 1, 0, 1]})
    path = tmp_path / f"table.{suffix}"
    frame.to_parquet(path) if suffix == "parquet" else frame.to_json(path, orient="records", lines=True)
    splits = local_files(str(path), validation=str(path), feature_columns=["f2", "f1"])
    assert splits["validation"]["features"] == [[1.0, 0.0], [1.0, 1.0], [0.0, 2.0], [0.0, 3.0]]
    assert splits["validation"]["label"] == [0, 1, 0, 1]


def test_local_files_errors_name_the_key(table, tmp_path):
    with pytest.raises(DataError, match="data.train: no such file 'missing.csv'"):
        local_files("missing.csv")
    with pytest.raises(DataError, match="data.validation: no such file"):
        local_files(str(table), validation=str(tmp_path / "val.csv"))
    with pytest.raises(ConfigError, match="data.label_column: 'species' is not a column of the data; columns are x, y, kind"):
        local_files(str(table), label_column="species")
    with pytest.raises(ConfigError, match="data.feature_columns: z not in the data"):
        local_files(str(table), label_column="kind", feature_columns=["x", "z"])
    text = tmp_path / "table.txt"
    text.write_text("a\n")
    with pytest.raises(ConfigError, match="data.format: 'txt' is not a file format this reads; choose one of csv, json, parquet"):
        local_files(str(text))


def test_sklearn_digits_ships_offline():
    splits = sklearn_digits(validation_fraction=0.2, seed=0)
    assert len(splits["train"]) + len(splits["validation"]) == 1797
    row = splits["train"][0]
    assert len(row["features"]) == 64 and 0.0 <= min(row["features"]) and max(row["features"]) <= 1.0


def test_offline_hub_name_fails_fast_and_clearly(tmp_path):
    """No network here: the probe fails in seconds instead of a minute of retries inside `datasets`."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    env.pop("HF_DATASETS_OFFLINE", None)
    # Failing fast means never reaching datasets.load_dataset, whose retries take a minute or more: it raises here.
    code = ("import datasets\n"
            "def retrying(*args, **kwargs): raise RuntimeError('datasets.load_dataset was reached')\n"
            "datasets.load_dataset = retrying\n"
            "from runner.data import hub\nhub('imdb')")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "data.name: cannot reach the Hugging Face Hub" in proc.stderr, proc.stderr[-2000:]
    assert "HF_HUB_OFFLINE=1" in proc.stderr and "load_dataset was reached" not in proc.stderr


def _dataset(rows: int = 10):
    return datasets.Dataset.from_dict(
        {"x": [[i, i + 1] for i in range(rows)], "y": list(range(rows))},
        features=datasets.Features(
            {"x": datasets.Sequence(datasets.Value("float32"), length=2), "y": datasets.Value("int64")}
        ),
    )


def test_tensor_and_arrow_batches_are_equal():
    dataset = _dataset(10)
    in_memory = make_batches(dataset, batch_size=4, shuffle=True, seed=1, in_memory_limit_mb=1)
    streamed = make_batches(dataset, batch_size=4, shuffle=True, seed=1, in_memory_limit_mb=0)
    assert isinstance(in_memory, TensorBatches) and isinstance(streamed, ArrowBatches)
    assert len(in_memory) == len(streamed) == 3
    for a, b in zip(in_memory, streamed):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])
        assert a["x"].dtype == torch.float32 and a["y"].dtype == torch.int64
        assert torch.equal(a["x"][:, 0], a["y"].float())


def test_batch_order_is_seeded_and_per_epoch():
    """The order repeats for a seed and reshuffles every epoch."""
    batches = make_batches(_dataset(32), batch_size=8, shuffle=True, seed=5, in_memory_limit_mb=1)
    epoch0 = torch.cat([batch["y"] for batch in batches])
    again = torch.cat([batch["y"] for batch in batches])
    batches.set_epoch(1)
    epoch1 = torch.cat([batch["y"] for batch in batches])
    assert torch.equal(epoch0, again)
    assert not torch.equal(epoch0, epoch1)
    assert sorted(epoch0.tolist()) == sorted(epoch1.tolist()) == list(range(32))


def test_shards_cover_each_row_once_across_ranks():
    for shuffle in (True, False):
        seen, lengths = [], []
        for rank in range(3):
            batches = make_batches(_dataset(10), batch_size=2, shuffle=shuffle, seed=0, in_memory_limit_mb=1)
            rows = torch.cat([batch["y"] for batch in batches.shard(rank, 3)]).tolist()
            seen, lengths = seen + rows, lengths + [len(rows)]
        assert set(seen) == set(range(10))
        # Training (shuffled) shards are padded to equal length so every rank takes the same steps: 2 rows repeat.
        # Evaluation shards are exact: each row once.
        assert (lengths, len(seen)) == (([4, 4, 4], 12) if shuffle else ([4, 3, 3], 10))


def test_drop_last_and_unshuffled_order():
    batches = make_batches(_dataset(10), batch_size=4, shuffle=False, seed=0, in_memory_limit_mb=1, drop_last=True)
    assert [batch["y"].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ragged_column_is_refused_with_the_fix():
    ragged = datasets.Dataset.from_dict({"x": [[1], [1, 2]], "y": [0, 1]})
    with pytest.raises(DataError, match="column 'x' holds lists of different lengths"):
        make_batches(ragged, batch_size=2, shuffle=False, seed=0, in_memory_limit_mb=1)
    with pytest.raises(DataError, match="column 'x' holds lists of different lengths"):
        next(iter(make_batches(ragged, batch_size=2, shuffle=False, seed=0, in_memory_limit_mb=0)))


def test_empty_split_is_refused():
    with pytest.raises(DataError, match="a split has no rows"):
        TensorBatches({"x": torch.zeros(0, 2)}, batch_size=2, shuffle=False, seed=0)
