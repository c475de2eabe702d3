"""`python -m runner`: the only @hydra.main. Compose, check, freeze, make the run dir, launch, report."""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner.checks import check
from runner.checkpoint import find_resume
from runner.config import RunConfig, RunSpec, register_configs
from runner.devices import apply_gpus, select_gpus
from runner.errors import PREEMPTED_EXIT_CODE, ConfigError, Preempted, RunnerError
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
        hardware = spec.config.hardware
        gpus = select_gpus(hardware.kind, spec.config.gpu_ids, hardware.num_processes)
        apply_gpus(gpus)  # CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises: before any check touches CUDA
        check(spec.config)
        if gpus.physical:
            log.info("%s", gpus.table(hardware.num_processes))
        resume_from = find_resume(spec.config.resume, run_dir, spec.config.checkpoint.verify)
        spec = replace(spec, resume_from=str(resume_from) if resume_from else None)
        _write_config(run_dir, spec.resolved, resume_from)
        final = launch(spec)
        value = monitored_value(final, spec.config.trainer.monitor)
    except RunnerError as err:
        return _fail(err, run_dir)
    except Preempted as stop:
        log.info("%s. Continue with the same command plus resume=auto hydra.run.dir=%s", stop, run_dir)
        raise SystemExit(PREEMPTED_EXIT_CODE)
    log.info("final %s | run dir %s", ", ".join(f"{k}={v:.4f}" for k, v in final.items()), run_dir)
    return value


def freeze(cfg: DictConfig, run_dir: Path) -> RunSpec:
    """Resolve every interpolation once, here, and hand workers plain typed objects (never a DictConfig)."""
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, RunConfig)
    return RunSpec(config=config, resolved=resolved, run_dir=str(run_dir))


def _write_config(run_dir: Path, resolved: dict, resume_from: Path | None) -> None:
    """config.yaml records how the run was started; a run continued in place keeps its original one."""
    if (run_dir / "config.yaml").is_file():
        log.info("continuing the run in %s from %s; its config.yaml is kept", run_dir, resume_from or "scratch")
        return
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    if resume_from:
        log.info("this run starts from the checkpoint %s", resume_from)


def monitored_value(final: dict[str, float], monitor: str) -> float:
    if monitor not in final:
        raise ConfigError("trainer.monitor", f"'{monitor}' was not measured; the final metrics are {', '.join(final)}")
    return final[monitor]


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
