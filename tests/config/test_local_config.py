"""Per-machine defaults: a git-ignored `local/machine.yaml` (conf/local/ in a checkout) sets hardware, precision
and gpu_ids once; a recipe's own choices win over it and the command line wins over both."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT

MACHINE = """# @package _global_
defaults:
  - override /hardware: multi_cpu
  - override /precision: bf16
gpu_ids: [0]
trainer:
  log_every_steps: 3
"""


@pytest.fixture
def search_dir(tmp_path):
    """A config dir holding local/machine.yaml, added to Hydra's search path as a user would keep it in conf/local."""
    (tmp_path / "conf" / "local").mkdir(parents=True)
    (tmp_path / "conf" / "local" / "machine.yaml").write_text(MACHINE)
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def composed(cli, *overrides) -> dict:
    result = cli("--cfg", "job", *overrides)
    assert result.returncode == 0, result.output
    return yaml.safe_load(result.stdout)


def test_machine_defaults_yield_to_recipe_and_cli(cli, search_dir):
    config = composed(cli, search_dir)
    assert config["hardware"]["kind"] == "multi_cpu" and config["precision"]["kind"] == "bf16"
    assert config["gpu_ids"] == [0]
    assert config["trainer"]["log_every_steps"] == 25  # the reverse recipe sets it: the recipe wins

    config = composed(cli, search_dir, "precision=fp16", "gpu_ids=all")
    assert config["precision"]["kind"] == "fp16" and config["gpu_ids"] == "all"


def test_no_machine_file_keeps_schema_defaults(cli):
    config = composed(cli)
    assert config["hardware"]["kind"] == "cpu" and config["precision"]["kind"] == "fp32"
    assert config["gpu_ids"] is None


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_conf_local_yaml_files_are_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "-q", "conf/local/machine.yaml"], cwd=ROOT)
    assert ignored.returncode == 0
