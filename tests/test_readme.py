"""The README's own examples, verbatim: the recipe in "Writing your own recipe" runs from a user's project."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT, read_scalars, run_cli

RESIDUAL_MLP = '''import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, in_features: int, out_features: int, width: int = 32):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(in_features, width), nn.Linear(width, width), nn.Linear(width, out_features)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(h + torch.relu(self.hidden(h)))
'''


def _readme_block(after: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(after):]
    return re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_recipe_runs_as_written_from_a_users_project(tmp_path):
    pandas = pytest.importorskip("pandas")
    import numpy as np

    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text(_readme_block("## Writing your own recipe"))
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "models.py").write_text(RESIDUAL_MLP)
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, 16)).astype("float32")
    table = pandas.DataFrame(features, columns=[f"f{i}" for i in range(16)])
    table["label"] = (features[:, :4].argmax(axis=1)).astype("int64")  # 4 classes
    table.to_parquet(tmp_path / "data" / "train.parquet")
    result = run_cli("recipe=mine", "trainer.max_epochs=2", "trainer.progress_bar=false", cwd=tmp_path)
    assert result.returncode == 0, result.output
    evaluations = read_scalars(result.run_dir(), "val/accuracy")
    assert [step for step, _ in evaluations] == [3, 6]  # 320 training rows / 128 = 3 steps an epoch
    assert evaluations[-1][1] > 0.3  # better than chance (0.25)
