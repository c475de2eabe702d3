"""Hydra finds these plugins by their namespace package (hydra_plugins), for every entry point alike (a run, a
sweep, --cfg, the compose API of the tools and tests):

- RunnerSearchPath adds the user's recipe folders (./recipes of the working directory, $RUNNER_RECIPE_PATH; ahead
  of the built-in recipes, so a user's recipe of the same name wins) and this machine's defaults written by
  `python -m runner machine` (`<config home>/local/machine.yaml`);
- RecipesConfigSource serves a folder of recipe files as the `recipe` group, so a user keeps `recipes/foo.yaml`
  in their own project: `recipes:///path/to/folder` is also what `hydra.searchpath=[...]` takes.
"""

from __future__ import annotations

import os
from typing import List, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

from hydra._internal.core_plugins.file_config_source import FileConfigSource

from runner.config.search_path import config_home, user_recipe_dirs

GROUP = "recipe"


class RunnerSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for folder in reversed(user_recipe_dirs()):  # prepended one by one: the first folder ends up first
            search_path.prepend(provider="runner-user-recipes", path=f"recipes://{folder}")
        home = config_home()
        if (home / "local").is_dir():
            search_path.append(provider="runner-machine", path=f"file://{home}")


class RecipesConfigSource(FileConfigSource):
    """A folder of recipes seen as a config root holding one group, `recipe`."""

    @staticmethod
    def scheme() -> str:
        return "recipes"

    def _inside(self, config_path: str) -> Optional[str]:
        """The path within the folder for `recipe/...`, None for anything else (this source has nothing else)."""
        config_path = config_path.strip("/")
        if config_path == GROUP:
            return ""
        return config_path[len(GROUP) + 1:] if config_path.startswith(GROUP + "/") else None

    def load_config(self, config_path: str) -> ConfigResult:
        return super().load_config(self._inside(config_path) or config_path)

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        inside = self._inside(config_path)
        return config_path.strip("/") == "" or (inside == "" and self.available())

    def is_config(self, config_path: str) -> bool:
        inside = self._inside(config_path)
        return bool(inside) and super().is_config(inside)

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if config_path.strip("/") == "":
            return [GROUP] if results_filter in (None, ObjectType.GROUP) else []
        if self._inside(config_path) != "":
            return []
        files: List[str] = []
        for name in os.listdir(self.path):
            self._list_add_result(files=files, file_path=f"{GROUP}/{name}", file_name=name,
                                  results_filter=results_filter)
        return sorted(set(files))
