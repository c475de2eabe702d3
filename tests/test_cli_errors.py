"""Bad input: a short message naming the key and the fix, a non-zero exit, no traceback, no leftover run dir."""

from __future__ import annotations

import pytest

from conftest import TINY


def _assert_clean_failure(result, *expected: str) -> None:
    assert result.returncode != 0, result.output
    for text in expected:
        assert text in result.output, f"{text!r} not in:\n{result.output}"
    assert "Traceback" not in result.output
    # Nothing that looks like a run: no run dir with a config.yaml, and no empty shell of one either.
    assert result.run_dirs() == []
    outputs = result.cwd / "outputs"
    assert not outputs.exists() or not any(path.is_file() for path in outputs.rglob("*")), list(outputs.rglob("*"))


def test_unknown_recipe_lists_the_recipes(cli):
    result = cli("recipe=revers")
    _assert_clean_failure(result, "Could not find 'recipe/revers'", "Available options in 'recipe'", "reverse", "digits_mlp")


def test_unknown_group_option_lists_the_options(cli):
    result = cli("precision=fp17")
    _assert_clean_failure(result, "precision/fp17", "bf16", "fp8")


def test_misspelled_key_names_the_full_key(cli):
    result = cli("trainer.max_step=3")
    _assert_clean_failure(result, "Key 'max_step' not in 'TrainerConfig'", "full_key: trainer.max_step")


def test_bad_enum_value_lists_the_valid_values(cli):
    result = cli("hardware.kind=gpus")
    _assert_clean_failure(result, "Invalid value 'gpus'", "cpu, gpu, multi_gpu, multi_cpu, tpu, auto", "hardware.kind")


def test_missing_target(cli):
    result = cli(*TINY, "~model._target_")
    _assert_clean_failure(result, "model._target_: is missing")


def test_unimportable_target(cli):
    result = cli(*TINY, "model._target_=runner.models.Transformr")
    _assert_clean_failure(result, "model._target_: cannot import 'runner.models.Transformr'", "no attribute 'Transformr'")


def test_target_outside_the_allow_list(cli):
    result = cli(*TINY, "model._target_=numpy.load")
    _assert_clean_failure(result, "'numpy.load' is not under an allowed module prefix", "allowed_targets")


def test_bad_constructor_argument_names_the_key_and_target(cli):
    result = cli(*TINY, "+model.widht=3")
    _assert_clean_failure(result, "model.widht: is not an argument of runner.models.SeqTransformer")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="asserts the no-CUDA message")
def test_gpu_without_cuda(cli):
    result = cli(*TINY, "hardware=gpu")
    _assert_clean_failure(result, "hardware: gpu needs a CUDA GPU", "hardware=cpu")


def test_missing_data_file(cli, tmp_path):
    result = cli("recipe=tabular_csv", f"data.train={tmp_path}/nope.csv")
    _assert_clean_failure(result, "data.train: no such file", "nope.csv")


def test_every_problem_reported_at_once(cli):
    result = cli(*TINY, "trainer.batch_size=0", "trainer.log_every_steps=0", "model._target_=runner.Nope")
    _assert_clean_failure(
        result, "3 problems", "trainer.batch_size: is 0", "trainer.log_every_steps: is 0", "model._target_: cannot import"
    )
