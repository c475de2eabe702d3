"""runner as a normal package: a wheel ships the configs and built-in recipes, a `runner` console script, and a
user's own project (their recipes in ./recipes, their package importable from where they run) works with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, WAIT_S, read_scalars

USER_RECIPE = """# @package _global_
# My experiment: my own model on the built-in reverse data.
defaults:
  - override /model: seq_transformer
allowed_targets: [runner., torch., mylab.]
model:
  _target_: mylab.models.Reverser    # my own torch.nn.Module, in ./mylab
  vocab_size: ${data.vocab_size}
  max_len: ${data.seq_len}
data:
  num_train: 128
  num_validation: 32
trainer:
  max_steps: 2
  progress_bar: false
"""
USER_MODEL = """from runner.models import SeqTransformer


class Reverser(SeqTransformer):
    pass
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed (not editable) into a folder of its own."""
    wheels, target = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(wheels)], check=True, capture_output=True)
    (wheel,) = wheels.glob("runner_ml-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    return target


def _isolated(installed: Path) -> dict:
    """Python without site processing (`-S`), so this checkout's editable install (a .pth hook) is not loaded:
    the installed copy, then the environment's other packages, are all it can import."""
    site_packages = [path for path in sys.path if path.endswith("site-packages")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), *site_packages]), "PYTHONUNBUFFERED": "1"}


def _in_project(installed: Path, project: Path, *command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed `runner` console script, run in the user's project folder."""
    return subprocess.run([sys.executable, "-S", str(installed / "bin" / "runner"), *command], cwd=project,
                          env={**_isolated(installed), **(env or {})}, capture_output=True, text=True, timeout=300)


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text(USER_RECIPE)
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "models.py").write_text(USER_MODEL)
    return tmp_path


def test_the_wheel_ships_configs_and_runs_a_project(installed, project):
    """The installed console script lists and runs a user project's own recipe."""
    where = subprocess.run([sys.executable, "-S", "-c", "import runner.config.search_path as p; print(p.config_dir())"],
                           env=_isolated(installed), capture_output=True, text=True, cwd=project)
    assert where.stdout.strip() == str(installed / "runner" / "conf")
    listed = _in_project(installed, project, "recipes", "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^mine +{re.escape(str(project / 'recipes'))}: My experiment: my own model", listed.stdout,
                     re.MULTILINE), listed.stdout
    assert "built-in: Reverse sequences of 12 random digits" in listed.stdout
    run = _in_project(installed, project, "recipe=mine")
    assert run.returncode == 0, run.stderr
    (run_dir,) = [path.parent for path in (project / "outputs").rglob("config.yaml") if (path.parent / ".hydra").is_dir()]
    assert "mylab.models.Reverser" in (run_dir / "config.yaml").read_text()
    assert [step for step, _ in read_scalars(run_dir, "val/accuracy")] == [2]


def test_a_user_recipe_wins_over_a_built_in_one(installed, project):
    """Of the same name: `recipes show reverse` shows the user's."""
    (project / "recipes" / "reverse.yaml").write_text("# @package _global_\n# Mine.\ntrainer:\n  max_steps: 3\n")
    shown = _in_project(installed, project, "recipes", "show", "reverse")
    assert shown.returncode == 0, shown.stderr
    assert "  max_steps: 3\n" in shown.stdout


def test_shell_completion_completes_a_group_name(installed, project):
    completed = _in_project(installed, project, "-sc", "query=bash",
                            env={"COMP_LINE": "runner hardw", "COMP_POINT": "12"})
    assert "hardware=" in completed.stdout.split(), completed.stdout + completed.stderr


def test_modules_import_without_posix_only_modules():
    """Nothing on the import path needs fcntl or SIGUSR1 (absent on Windows): each has a fallback."""
    probe = (
        "import sys, signal, pkgutil, importlib, runner\n"
        "sys.modules['fcntl'] = None\n"
        "del signal.SIGUSR1\n"
        "failed = []\n"
        "for module in pkgutil.walk_packages(runner.__path__, 'runner.'):\n"
        "    try:\n"
        "        importlib.import_module(module.name)\n"
        "    except Exception as error:\n"
        "        failed.append(f'{module.name}: {error!r}')\n"
        "print('\\n'.join(failed) or 'ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=WAIT_S)
    assert result.stdout.strip() == "ok", result.stdout + result.stderr


def test_the_accelerator_imports_only_what_loops_use():
    """`from runner import Accelerator` in a plain script: no Hydra, OmegaConf, YAML, datasets, TensorBoard or
    safetensors (each costs start-up time; a loop that saves state imports safetensors then), and nothing of the
    runner's own data package."""
    probe = (
        "import sys, torch, torch.utils.data\n"
        "before = set(sys.modules)\n"
        "from runner import Accelerator, DataLoaderConfiguration\n"
        "accelerator = Accelerator(cpu=True)\n"
        "model = accelerator.prepare(torch.nn.Linear(2, 1))\n"
        "new = set(sys.modules) - before\n"
        "print(' '.join(sorted({name.split('.')[0] for name in new})))\n"
        "print(' '.join(sorted(name for name in new if name.startswith('runner.data.'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=WAIT_S)
    assert result.returncode == 0, result.stderr
    top_level, data_modules = result.stdout.split("\n")[:2]
    imported = set(top_level.split())
    # prepare() knows the runner's batch sources by their base class (runner/accelerate/prepared.py's BatchSource)
    assert data_modules == "", data_modules
    heavy = {"hydra", "omegaconf", "yaml", "datasets", "tensorboard", "safetensors", "pyarrow", "pandas", "tqdm"}
    assert imported & heavy == set(), imported


# -- install hints: the distribution's name and its extras -----------------------------------------------------------

def _declared_extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


HINT_PATTERNS = (
    r"install_hint\(\s*[\"'](\w+)[\"']",  # a message built by runner.ground.install_hint
    r"pip install -e [\"']\.\[([\w,]+)\][\"']",  # in the docs: run in a checkout
    r"`(\w+)` extra of runner-ml",  # comments in conf/ and recipes/, which ship in the wheel
)


def test_every_install_hint_names_a_declared_extra():
    """An extra that pyproject.toml declares, in the docs, configs, recipes, runner and benchmarks."""
    extras, named, wrong_distribution = _declared_extras(), [], []
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "conf").rglob("*.yaml"),
             *(ROOT / "recipes").rglob("*.yaml"), *(ROOT / "runner").rglob("*.py"),
             *(ROOT / "benchmarks").rglob("*.py")]
    for path in files:
        text = path.read_text()
        for pattern in HINT_PATTERNS:
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                named += [(f"{path.relative_to(ROOT)}:{line}", extra) for extra in match.group(1).split(",")]
        # `runner` on the package index is someone else's project (a 2013 command runner)
        wrong_distribution += [f"{path.relative_to(ROOT)}: {hint}"
                               for hint in re.findall(r"pip install '?runner\[\w+\]", text)]
    from runner.run.compose import PLUGIN_EXTRAS

    named += [(f"PLUGIN_EXTRAS[{config!r}]", extra) for config, extra in PLUGIN_EXTRAS.items()]
    assert len(named) > 30, named  # the patterns still find the hints
    assert [f"{where}: '{extra}'" for where, extra in named if extra not in extras] == []
    assert wrong_distribution == []


def test_install_hints_list_the_extras_packages(installed, tmp_path):
    """From the wheel installed in a folder of its own, run in an unrelated folder: the hint is the extra's packages
    as pyproject declares them, which pip installs from anywhere (an editable `.[digits]` only works in a checkout)."""
    from packaging.requirements import Requirement

    extras = _declared_extras()
    probe = "from runner.ground import install_hint\nfor extra in %r: print(install_hint(extra))" % sorted(extras)
    result = subprocess.run([sys.executable, "-S", "-c", probe], env=_isolated(installed), cwd=tmp_path,
                            capture_output=True, text=True, timeout=WAIT_S)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(extras), result.stdout
    for extra, hint in zip(sorted(extras), result.stdout.splitlines()):
        packages, suffix = re.fullmatch(r"pip install (.+) \(the '(\w+)' extra of runner-ml\)", hint).groups()
        assert suffix == extra
        assert sorted(map(str, map(Requirement, re.findall(r"'([^']+)'", packages)))) == \
            sorted(map(str, map(Requirement, extras[extra]))), hint


def test_a_missing_plugin_config_names_its_extra(monkeypatch):
    """Hydra's own error for a config that only a plugin provides ("Could not find 'hydra/launcher/...'"), as the
    runner prints it: with the extra that installs the plugin. A name no plugin provides stands in for the plugin
    that is installed here."""
    from runner.errors import ConfigError
    from runner.run import compose

    monkeypatch.setitem(compose.PLUGIN_EXTRAS, "hydra/launcher/absent_plugin", "slurm")
    with pytest.raises(ConfigError) as err:
        compose.compose_config(["hydra/launcher=absent_plugin"])
    assert str(err.value).endswith(
        "Could not find 'hydra/launcher/absent_plugin': that config comes with a Hydra plugin that is not installed; "
        "install it with pip install 'hydra-submitit-launcher==1.2.0' (the 'slurm' extra of runner-ml)"), str(err.value)


def test_each_plugin_config_comes_from_its_extra():
    """Each config in PLUGIN_EXTRAS composes here (its plugin is installed), and its `_target_` lives in a package
    that the named extra installs (hydra_plugins.hydra_joblib_launcher... -> hydra-joblib-launcher)."""
    from hydra import compose, initialize_config_dir
    from packaging.requirements import Requirement

    from runner.run.compose import CONFIG_DIR, CONFIG_NAME, PLUGIN_EXTRAS

    extras = _declared_extras()
    for config, extra in PLUGIN_EXTRAS.items():
        group, name = config.rsplit("/", 1)
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(CONFIG_NAME, overrides=[f"{group}={name}"], return_hydra_config=True)
        target = cfg.hydra[group.split("/")[1]]["_target_"]
        package = target.split(".")[1].replace("_", "-")  # hydra_plugins.<package>.<module>.<Class>
        assert package in {Requirement(requirement).name for requirement in extras[extra]}, (config, target, extra)
