"""A user's table with nothing restated: the model's sizes come from the data, features are standardised with the
training rows' statistics, and those statistics travel with the checkpoint and the export."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import run_dirs_under

from runner.commands.cli import main
from runner.data import local_files
from runner.data.shapes import Standardize, data_sizes, fill_from_data, fit_statistics
from runner.errors import ConfigError, DataError
from runner.models import MLP


def _table(path, rows: int = 150, seed: int = 0) -> None:
    """Three classes told apart by two features on very different scales (as wine's columns are: 0.1 to 1,680),
    and a constant column."""
    generator = torch.Generator().manual_seed(seed)
    lines = ["grams,ratio,constant,kind"]
    for row in range(rows):
        kind = row % 3
        grams = 1000.0 + 400.0 * kind + 60.0 * torch.randn((), generator=generator).item()
        ratio = 0.01 * (kind == 1) + 0.002 * torch.randn((), generator=generator).item()
        lines.append(f"{grams:.3f},{ratio:.5f},7,{['red', 'rose', 'white'][kind]}")
    path.write_text("\n".join(lines) + "\n")


def test_schema_states_feature_and_class_counts(tmp_path):
    _table(tmp_path / "t.csv")
    splits = local_files(str(tmp_path / "t.csv"), label_column="kind")
    assert splits["train"].features["label"].names == ["red", "rose", "white"]
    assert data_sizes(splits["train"]) == {"features": 3, "classes": 3}
    (tmp_path / "n.csv").write_text("a,label\n" + "".join(f"{i},{1 + i % 3}\n" for i in range(12)))
    numbered = local_files(str(tmp_path / "n.csv"))
    assert numbered["train"].features["label"].num_classes == 4  # labels 1..3 are classes 1..3 (0 unused)
    assert fill_from_data({"in_features": None, "out_features": 5}, splits["train"], None) == \
        {"in_features": 3, "out_features": 5}  # only the null ones
    no_schema = datasets.Dataset.from_dict({"features": [[1.0], [2.0, 3.0]], "label": [0, 1]})
    with pytest.raises(ConfigError, match=r"model.in_features: is null, so the data should say it, but the training "
                                          r"split's 'features' column is not a fixed-length list"):
        fill_from_data({"in_features": None}, no_schema, None)


def test_standardize_uses_train_split_stats(tmp_path):
    _table(tmp_path / "t.csv")
    train = local_files(str(tmp_path / "t.csv"), label_column="kind")["train"]
    model = MLP(3, 3, hidden=[8], standardize=True)
    fit_statistics(model, train, None)
    features = train.with_format("torch")[:]["features"].double()
    layer = model[0]
    assert isinstance(layer, Standardize)
    torch.testing.assert_close(layer.mean, features.mean(0).float())
    torch.testing.assert_close(layer.std[:2], features.std(0, unbiased=False)[:2].float())
    assert layer.std[2].item() == 1.0  # the constant column: 0 after standardising, not NaN
    standardised = layer(features.float())
    torch.testing.assert_close(standardised[:, :2].mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    assert torch.isfinite(standardised).all()


def test_tabular_recipe_learns_with_no_sizes_given(tmp_path, monkeypatch):
    """The tabular recipe learns a table with no model sizes given, and exports its statistics."""
    _table(tmp_path / "wines.csv")
    monkeypatch.chdir(tmp_path)
    main(["recipe=tabular_csv", "data.train=wines.csv", "data.label_column=kind", "trainer.max_epochs=8",
          "trainer.progress_bar=false"])
    run_dir, = run_dirs_under(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["final"]["val/accuracy"] >= 0.95, result
    exported = yaml.safe_load((run_dir / "export" / "config.yaml").read_text())
    assert (exported["model"]["in_features"], exported["model"]["out_features"]) == (3, 3)
    weights = load_file(run_dir / "export" / "final.safetensors")
    train = local_files("wines.csv", label_column="kind")["train"]  # the same seeded hold-out as the run's
    features = train.with_format("torch")[:]["features"].double()
    torch.testing.assert_close(weights["0.mean"], features.mean(0).float())
    # Inference without the runner: the export alone classifies raw (unstandardised) rows.
    model = MLP(**{k: v for k, v in exported["model"].items() if k != "_target_"})
    model.load_state_dict(weights)
    predicted = model(torch.tensor([[1000.0, 0.0, 7.0], [1400.0, 0.01, 7.0], [1800.0, 0.0, 7.0]])).argmax(-1)
    assert predicted.tolist() == [0, 1, 2]


def test_benchmarks_tables_writes_iris_and_wine(tmp_path):
    """benchmarks/tables.py writes iris and wine as a user would have them."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    assert tables.write_tables(tmp_path) == {"iris": 150, "wine": 178}
    wine = local_files(str(tmp_path / "wine.csv"), label_column="cultivar")
    iris = local_files(str(tmp_path / "iris.csv"), label_column="species")
    assert data_sizes(wine["train"]) == {"features": 13, "classes": 3}
    assert iris["train"].features["label"].names == ["setosa", "versicolor", "virginica"]
    assert len(wine["validation"]) == 36 and len(iris["validation"]) == 30  # the hold-outs the README's figures use


def test_an_unreadable_file_is_reported_once(tmp_path, caplog):
    """datasets logs a reader's error before raising it, through its own handler and the root logger's: the runner's
    message is the only report of it."""
    (tmp_path / "table.parquet").write_text("a,b,label\n1,2,x\n")
    with pytest.raises(DataError, match=r"data.train: cannot read .*table.parquet as parquet: ArrowInvalid"):
        local_files(str(tmp_path / "table.parquet"))
    assert not [record for record in caplog.records if "ArrowInvalid" in record.getMessage()]


def test_labels_the_training_split_lacks_are_named(tmp_path, caplog):
    """A validation file with a class the training file lacks trains silently otherwise (the model cannot learn
    it); labels of another kind (numbers against class names) are refused."""
    from runner.data.tabular import _label_encoder

    rows = "".join(f"{i},{i % 3},{i % 2 + (7 if i == 3 else 0)}\n" for i in range(20))
    (tmp_path / "train.csv").write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    (tmp_path / "validation.csv").write_text("a,b,label\n" + rows)
    local_files(str(tmp_path / "train.csv"), validation=str(tmp_path / "validation.csv"))
    assert "data.validation holds label(s) the training split lacks, which the model cannot learn: 8" in caplog.text
    splits = {"train": datasets.Dataset.from_dict({"label": ["x", "y"]}),
              "validation": datasets.Dataset.from_dict({"label": [0, 1]})}
    with pytest.raises(DataError, match=r"data.validation: its label column 'label' holds int64 values, and "
                                        r"data.train's holds class names \(text\)"):
        _label_encoder(splits, "label")
    splits = {"train": splits["validation"], "validation": splits["train"]}
    with pytest.raises(DataError, match=r"data.validation: its label column 'label' holds class names \(text\), "
                                        r"and data.train's holds int64 values"):
        _label_encoder(splits, "label")
