"""`python -m runner`: the only @hydra.main. Compose, check, freeze, make the run dir, launch, report."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner.checks import check
from runner.config import RunConfig, RunSpec, register_configs
from runner.devices import apply_gpus, select_gpus
from runner.errors import ConfigError, RunnerError
from runner.launch import launch, resolve_num_processes
from runner.report import finished_result

log = logging.getLogger("runner")

register_configs()

# An absolute path next to the package: `python -m runner` works from any working directory.
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    try:
        spec = freeze(cfg, run_dir)
        resolve_num_processes(spec)  # null: one per selected GPU on multi_gpu; the checks below need the count
        if spec.config.resume == "auto":
            done = finished_result(run_dir, list(HydraConfig.get().overrides.task))
            if done is not None:
                log.info("resume=auto: %s already finished with %s=%.4f; not running it again", run_dir, done.monitor, done.value)
                return done.value
            _resume_auto_standin(spec, run_dir)
        hardware = spec.config.hardware
        gpus = select_gpus(hardware.kind, spec.config.gpu_ids, hardware.num_processes)
        apply_gpus(gpus)  # CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises: before any check touches CUDA
        check(spec.config)
        if gpus.physical:
            log.info("%s", gpus.table(hardware.num_processes))
        (run_dir / "config.yaml").write_text(yaml.safe_dump(spec.resolved, sort_keys=False), encoding="utf-8")
        final = launch(spec)
        value = monitored_value(final, spec.config.trainer.monitor)
    except RunnerError as err:
        return _fail(err, run_dir)
    log.info("final %s | run dir %s", ", ".join(f"{k}={v:.4f}" for k, v in final.items()), run_dir)
    return value


def freeze(cfg: DictConfig, run_dir: Path) -> RunSpec:
    """Resolve every interpolation once, here, and hand workers plain typed objects (never a DictConfig)."""
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, RunConfig)
    return RunSpec(config=config, resolved=resolved, run_dir=str(run_dir))


def monitored_value(final: dict[str, float], monitor: str) -> float:
    if monitor not in final:
        raise ConfigError("trainer.monitor", f"'{monitor}' was not measured; the final metrics are {', '.join(final)}")
    return final[monitor]


def _resume_auto_standin(spec: RunSpec, run_dir: Path) -> None:
    """Stand-in until checkpoint resume (issue 5) lands. `auto`: the latest checkpoint of a job that was killed
    (it left no result.json); a fresh start for a new job, a failed one, or one whose overrides changed."""
    latest = run_dir / "checkpoints" / "latest"
    interrupted = latest.is_file() and not (run_dir / "result.json").exists()
    spec.config.resume = str(latest.parent / latest.read_text().strip()) if interrupted else None


def _fail(err: RunnerError, run_dir: Path) -> float:
    """Say what went wrong in one paragraph; drop a run dir that holds nothing but Hydra's bookkeeping."""
    started = any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", "tensorboard"))
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if not started and not multirun:  # a sweep keeps the job dir: its result.json records this error
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"runner: error: {err}", file=sys.stderr)
    if started:
        print(f"runner: the run dir {run_dir} keeps what the run wrote before it stopped", file=sys.stderr)
    if multirun:
        raise err  # the sweeper records this job as failed and runs the others
    raise SystemExit(1)
