"""Where configs live: the runner's own (conf/, with the built-in recipes), this machine's defaults, and the
user's recipes. Plain paths, no Hydra: the CLI, the recipe commands and the Hydra plugin
(hydra_plugins/runner_searchpath) all ask here.
"""

from __future__ import annotations

import os
from pathlib import Path

RECIPE_PATH_VARIABLE = "RUNNER_RECIPE_PATH"  # more recipe folders, separated like PATH


def config_dir() -> Path:
    """The runner's configs: inside the installed package (a wheel ships them as runner/conf), or the checkout's
    top-level conf/ (an editable install or a source tree)."""
    package = Path(__file__).resolve().parents[1]  # runner/
    installed = package / "conf"
    return installed if (installed / "config.yaml").is_file() else package.parent / "conf"


def builtin_recipes() -> Path:
    return config_dir() / "recipe"


def config_home() -> Path:
    """$RUNNER_CONFIG_HOME, else ~/.config/runner: this machine's defaults (runner/commands/machine.py)."""
    return Path(os.environ.get("RUNNER_CONFIG_HOME") or Path.home() / ".config" / "runner").expanduser()


def machine_file() -> Path:
    return config_home() / "local" / "machine.yaml"


def user_recipe_dirs() -> list[Path]:
    """The user's recipe folders, first wins: ./recipes of the working directory, then $RUNNER_RECIPE_PATH's."""
    listed = [Path("recipes")] + [Path(item) for item in os.environ.get(RECIPE_PATH_VARIABLE, "").split(os.pathsep)
                                  if item]
    found = []
    for folder in listed:
        folder = folder.expanduser().resolve()
        if folder.is_dir() and folder != builtin_recipes().resolve() and folder not in found:
            found.append(folder)
    return found
