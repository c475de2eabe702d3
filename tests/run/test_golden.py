"""Golden losses: each recipe in tests/golden.py (the recipes, their overrides, the file format, the recorder)
trained for a few dozen steps on small generated data, its train and val losses compared with the recorded ones in
tests/assets/losses/<recipe>.txt; the default recipe also on 2 processes, against the same file. A change that
shifts every run alike (initialisation, data order, the loss, the schedule, a tokenizer) is caught even though the
runs still agree with each other. After a deliberate change: `python tests/golden.py --record RECIPE`."""

from __future__ import annotations

import pytest
import torch

import golden
import matrix_data
from conftest import ROOT, run_in_process

# Relative: summation order differs between 1 and 2 processes (1e-7 here) and between CPU kernels (AVX2, AVX-512).
TOLERANCE = 1e-3


def assert_losses_match(run_dir, recipe):
    expected = golden.read(recipe).losses
    found = golden.losses_of(run_dir)
    for tag in golden.TAGS:
        where = f"{tag} of recipe={recipe} vs {golden.path(recipe).relative_to(ROOT)}"
        assert [step for step, _ in found[tag]] == [step for step, _ in expected[tag]], f"steps of {where}"
        # As {step: value}, so that a mismatch is reported by its step.
        assert dict(found[tag]) == pytest.approx(dict(expected[tag]), rel=TOLERANCE), (
            f"{where}: if the change is deliberate, re-record: {golden.record_command(recipe)}")


def test_every_recipe_has_a_golden_file():
    recipes = sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))
    assert sorted(golden.GOLDEN) == recipes, "a recipe without a golden run: add it to GOLDEN in tests/golden.py"
    files = sorted(path.stem for path in golden.LOSSES.glob("*.txt"))
    assert files == recipes, f"record the missing ones: python tests/golden.py --record RECIPE ({golden.LOSSES})"


@pytest.mark.parametrize("recipe", sorted(golden.GOLDEN))
def test_recipe_losses_match_the_golden_file(recipe, tmp_path, capsys):
    if recipe == "gpt2_hf":
        pytest.importorskip("transformers")
    recorded = golden.read(recipe).overrides
    assert recorded == golden.overrides(recipe), (
        f"{golden.path(recipe).name} was recorded with other overrides: {golden.record_command(recipe)}")
    matrix_data.write(tmp_path)  # the files the overrides name, in the run's working directory
    # The thread count the recording used: a convolution's sums are split by thread (digits_cnn's val/loss moved by
    # 2e-3 relative on this process's default of 2), so the same count makes the comparison one of kernels only.
    threads = torch.get_num_threads()
    torch.set_num_threads(golden.RECORDER_THREADS)
    try:
        result = run_in_process(*golden.overrides(recipe), cwd=tmp_path, capsys=capsys)
    finally:
        torch.set_num_threads(threads)
    assert result.returncode == 0, result.output
    assert_losses_match(result.run_dir(), recipe)


def test_two_processes_match_the_golden_file(cli):
    # Several ranks need processes of their own: the real CLI, forked workers on gloo.
    result = cli(*golden.overrides("reverse"), "hardware=multi_cpu", "hardware.start_method=fork")
    assert result.returncode == 0, result.output
    assert_losses_match(result.run_dir(), "reverse")
