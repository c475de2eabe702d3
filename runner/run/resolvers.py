"""The schema's registration with Hydra's ConfigStore and the runner's OmegaConf resolvers.

In run/, not config/: two resolvers read the launcher's environment (runner.distributed, layer 2) and one asks
runner.run.slurm, so this sits with composing a run, above them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from runner.config import MonitorMode, RunConfig


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can list `runner_schema` first in its defaults, and the
    resolvers: `runner_direction` (the search configs optimize in the direction of `trainer.monitor_mode`), the
    two that give all torchrun ranks one run dir and each its own Hydra log file, `runner.in_run_dir` and
    `runner.study_seed` (a continued search draws new values).
    Hydra and OmegaConf are imported here, not with the module: `from runner import Accelerator` needs neither."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="runner_schema", node=RunConfig)
    resolvers = {"runner_direction": optuna_direction, "runner.rank_suffix": _rank_suffix,
                 "runner.launcher_run_id": _launcher_run_id, "runner.in_run_dir": _in_run_dir,
                 "runner.dir_suffix": dir_suffix, "runner.slurm_request": _slurm_request,
                 "runner.study_seed": study_seed}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def _slurm_request(what: str, kind: Any, num_processes: Any, threads_per_process: Any) -> Any:
    """conf/hydra/launcher/slurm.yaml: a trial's CPUs, memory and GPUs from the hardware group (runner/run/slurm.py)."""
    from runner.run.slurm import slurm_request

    return slurm_request(what, kind, num_processes, threads_per_process)


def optuna_direction(mode: MonitorMode | str) -> str:
    """`${runner_direction:${trainer.monitor_mode}}` -> maximize / minimize, as Optuna's sweeper spells them."""
    return "maximize" if MonitorMode(mode) == MonitorMode.max else "minimize"


def study_seed(seed: int, storage: Optional[str], study_name: str) -> int:
    """`${runner.study_seed:0,${hydra.sweeper.storage},${hydra.sweeper.study_name}}` -> the sampler's seed plus the
    trials its study already holds. Optuna's samplers start their random draws from the seed (TPE's first
    n_startup_trials are random), so running the same search command again to continue the study drew the same
    values as its first trials; the same history still gives the same draws."""
    study = _existing_study(storage, study_name)
    return int(seed) + (len(study.trials) if study is not None else 0)


def study_directions(storage: Optional[str], study_name: str) -> list[str]:
    """The directions (maximize, minimize) of the study `study_name` already in `storage`; [] if there is none."""
    study = _existing_study(storage, study_name)
    return [direction.name.lower() for direction in study.directions] if study is not None else []


def _existing_study(storage: Optional[str], study_name: str):
    if not storage:
        return None  # an in-memory study starts empty every time
    if str(storage).startswith("sqlite:///") and not Path(str(storage)[len("sqlite:///"):]).is_file():
        return None  # no study yet (and loading one would create the file)
    import optuna

    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # the storage holds other studies only
        return None


def _launcher_run_id(default: str) -> str:
    """The id every rank of one torchrun launch shares (so they agree on one run dir), else `default`."""
    from runner.distributed.dist import external_run_id

    return external_run_id() or default


def _in_run_dir(name: str) -> Optional[str]:
    """`${runner.in_run_dir:tokenizer}` -> "<this run's dir>/tokenizer" (where a data factory saves what the run
    needs later, e.g. its trained tokenizer); None where no Hydra run is going on (a config composed in a test)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        output_dir = HydraConfig.get().runtime.output_dir
    except Exception:  # HydraConfig not set, or runtime.output_dir missing: not inside a run
        return None
    return str(Path(output_dir).resolve() / name)


def dir_suffix(name: Optional[str]) -> str:
    """`${runner.dir_suffix:${logging.name}}` -> "_<name>" made safe as one path component, "" without a name."""
    import re

    if not name:
        return ""
    return "_" + re.sub(r"[^A-Za-z0-9._=+-]+", "-", str(name)).strip("-.")[:80]


def _rank_suffix() -> str:
    """"_rank<N>" in a process started by torchrun (or SLURM via torchrun), "" otherwise."""
    from runner.distributed.dist import external_rank

    rank = external_rank()
    return "" if rank is None else f"_rank{rank}"
