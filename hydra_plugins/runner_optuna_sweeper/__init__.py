"""The Optuna sweeper (the `sweeps` extra's hydra-optuna-sweeper) with one thing changed: a search in which no
trial completed ends in one paragraph that points at the sweep report, not in Optuna's "ValueError: Record does not
exist" traceback (the plugin asks the study for its best trial after the last one, and a study that holds only
failed trials has none). The CLI runs every Optuna search through this class (runner/commands/cli.py); where the
extra is not installed, this module defines nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from hydra.errors import CompactHydraException

try:
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as _PluginSweeper
except ImportError:  # the sweeps extra is not installed
    _PluginSweeper = None

PLUGIN_TARGET = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


class NoTrialCompleted(CompactHydraException):
    """Every trial of the search failed; each one's error is in the sweep report."""


if _PluginSweeper is not None:

    class OptunaSweeper(_PluginSweeper):
        def sweep(self, arguments: List[str]) -> None:
            try:
                return super().sweep(arguments)
            except ValueError as err:
                no_trial_completed(self.sweeper.config, err)
                raise

    TARGET = f"{OptunaSweeper.__module__}.{OptunaSweeper.__qualname__}"


def no_trial_completed(config, err: ValueError) -> None:
    """Raise NoTrialCompleted when the sweep's own records say no trial completed: then Optuna's error is the
    study's missing best trial. Any other ValueError is left to surface as it is."""
    from runner.sweep.report import JobStatus, collect_results

    sweep_dir = Path(str(config.hydra.sweep.dir))
    mode = config.trainer.monitor_mode
    results = collect_results(sweep_dir, str(config.trainer.monitor), str(getattr(mode, "value", mode)))
    if not results or any(result.status == JobStatus.completed for result in results):
        return
    study = config.hydra.sweeper.study_name
    raise NoTrialCompleted(
        f"every one of the {len(results)} trials of the search failed, so study '{study}' has no best trial "
        f"and the search has no result; each trial's error is in {sweep_dir / 'sweep_report.md'}") from err
