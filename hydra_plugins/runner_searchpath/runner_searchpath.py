"""Hydra finds this plugin by its namespace package (hydra_plugins) and asks it where else configs live: the
machine's own defaults written by `python -m runner.machine` (`<config home>/local/machine.yaml`), for every
entry point alike (a run, a sweep, --cfg, the compose API of the tools and tests)."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from runner.machine import config_home


class RunnerSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        home = config_home()
        if (home / "local").is_dir():
            search_path.append(provider="runner-machine", path=f"file://{home}")
