"""Every recipe with every option of every config group: composed, checked and built in-process (the model on the
meta device, the data for real on small files, one batch's shapes through the model). Each pair either builds, or
is in tests/run/recipe_pairs.yaml with the key its message names, and then the message also names the recipe and the
pair. A new recipe, group option or incompatibility is a reviewed change of that file.

Regenerate the file after an intended change: `python tests/run/test_recipe_matrix.py > tests/run/recipe_pairs.yaml`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

if __name__ == "__main__":  # run as a script: the shared helpers in tests/, as pytest's conftest.py puts them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import matrix_data
from runner.run import validate as validate_module
from runner.run.compose import CONFIG_DIR, TARGET_GROUPS, apply_group_swaps, freeze, with_recipe
from runner.distributed.devices import resolve_hardware
from runner.errors import RunnerError

GROUPS = ("hardware", "parallel", "precision", "model", "optimizer", "scheduler", "data", "task", "tokenizer")
DATA_GROUPS = ("data", "model", "task", "tokenizer")  # swaps that can only be judged with data in the model
# What this machine lacks (a GPU, torch_xla, the Hub): not an incompatibility, and the same for every recipe.
MACHINE = {"hardware": {"gpu", "multi_gpu", "tpu"}, "precision": {"fp8"}, "model": {"hf_pretrained"},
           "tokenizer": {"pretrained"}, "data": {"hub"}}
EXPECTED = Path(__file__).with_name("recipe_pairs.yaml")


def _options() -> dict[str, list[str]]:
    root = Path(CONFIG_DIR)
    return {group: sorted(path.stem for path in (root / group).glob("*.yaml")) for group in GROUPS}


def _recipes() -> list[str]:
    return sorted(path.stem for path in (Path(CONFIG_DIR) / "recipe").glob("*.yaml"))


def outcomes(folder: Path) -> dict[tuple[str, str, str], RunnerError | None]:
    """(recipe, group, option) -> None when it builds, else the error a run would stop with."""
    files = matrix_data.write(folder)
    results = {}
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for recipe in _recipes():
            for group, options in _options().items():
                for option in options:
                    overrides = [f"recipe={recipe}", f"{group}={option}",
                                 *matrix_data.overrides(recipe, group, option, files)]
                    try:
                        # As a run composes it: a swapped group drops the recipe's keys for it (runner.commands.cli).
                        cfg = apply_group_swaps(compose("config", overrides=overrides, return_hydra_config=True))
                        spec = freeze(cfg, folder / "run")
                        hardware = resolve_hardware(spec.config.hardware, spec.config.gpu_ids)
                        validate_module.validate(spec.config, hardware, build_the_data=group in DATA_GROUPS)
                        results[recipe, group, option] = None
                    except RunnerError as err:
                        results[recipe, group, option] = with_recipe(err, {"recipe": recipe}, [f"{group}={option}"])
    return results


def _first_key(err: RunnerError) -> str:
    problems = getattr(err, "problems", None)
    return problems[0].key if problems else type(err).__name__


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, monkeypatch_module):
    # The same data is built for many pairs: build each distinct data config once.
    cache = {}
    build = validate_module.build_data

    def cached(node):
        key = json.dumps(node, sort_keys=True, default=str)
        if key not in cache:
            cache[key] = build(node)
        return cache[key]

    monkeypatch_module.setattr(validate_module, "build_data", cached)
    return outcomes(tmp_path_factory.mktemp("recipe_matrix"))


@pytest.fixture(scope="module")
def monkeypatch_module():
    patcher = pytest.MonkeyPatch()
    yield patcher
    patcher.undo()


def test_every_recipe_option_builds_or_is_listed(matrix):
    """Every recipe with every group option builds, or is a listed incompatible pair."""
    expected = yaml.safe_load(EXPECTED.read_text())
    assert set(expected) == set(_recipes())
    for (recipe, group, option), err in matrix.items():
        listed = expected[recipe].get(group, {}).get(option)
        if err is None:
            assert listed is None, f"recipe={recipe} {group}={option} builds now: drop it from {EXPECTED.name}"
            continue
        assert listed == _first_key(err), f"recipe={recipe} {group}={option}: {err}"
        assert "Traceback" not in str(err)
        if group in TARGET_GROUPS and option not in MACHINE.get(group, ()):
            assert f"recipe={recipe} and {group}={option} do not go together" in str(err), str(err)


def test_missing_hardware_reads_the_same_per_recipe(matrix):
    """What this machine lacks (a CUDA GPU, torch_xla) is the same message for every recipe."""
    for (recipe, group, option), err in matrix.items():
        if option in MACHINE.get(group, ()) and group in ("hardware", "precision"):
            assert err is not None and any(word in str(err) for word in ("CUDA GPU", "torch_xla")), (recipe, option)


def test_every_recipe_builds_with_its_own_groups(matrix):
    for recipe in _recipes():
        assert matrix[recipe, "hardware", "cpu"] is None and matrix[recipe, "hardware", "multi_cpu"] is None, recipe
        assert matrix[recipe, "precision", "bf16"] is None and matrix[recipe, "parallel", "ddp"] is None, recipe


if __name__ == "__main__":  # regenerate tests/run/recipe_pairs.yaml
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        found = outcomes(Path(tmp))
    table: dict = {recipe: {} for recipe in _recipes()}
    for (recipe, group, option), err in found.items():
        if err is not None:
            table[recipe].setdefault(group, {})[option] = _first_key(err)
    print("# recipe -> group -> option -> the key its error names; every pair not listed builds (tests/run/test_recipe_matrix.py)")
    print(yaml.safe_dump(table, sort_keys=True), end="")
