"""Cross-field checks of a composed config against this machine, run once in the parent before anything starts.

Every problem is collected and reported at once (one ConfigError), each naming its key and what would be valid.
"""

from __future__ import annotations

import os

from runner.config.instantiate import target_problems
from runner.config import Launcher, ParallelKind, RunConfig, StartMethod
from runner.distributed.devices import KINDS, Hardware
from runner.errors import ConfigError, Problem
from runner.accelerate.parallel import compile_problems, parallel_problems
from runner.training.batch_plan import batch_problems
from runner.accelerate.precision import precision_problems

POSITIVE_INTS = ("max_epochs", "log_every_steps", "data_in_memory_mb")
POSITIVE_OR_NONE = ("max_steps", "eval_every_steps", "eval_batch_size", "max_grad_norm", "limit_train_batches",
                    "limit_val_batches", "overfit_batches", "fast_dev_run")


def check(config: RunConfig, hardware: Hardware) -> None:
    """Every problem of this config on this machine (as `hardware` resolved it), raised as one ConfigError."""
    problems = trainer_problems(config) + launch_problems(config, hardware) + checkpoint_problems(config)
    if hardware.world_size >= 1:  # a process count below 1 is reported by launch_problems
        problems += batch_problems(config.trainer, hardware.world_size)
    problems += list(hardware.problems)
    problems += precision_problems(config.precision.kind, config.precision.fp8_emulation, hardware.device_type)
    problems += parallel_problems(config.parallel, config.precision.kind, hardware.device_type)
    problems += compile_problems(config.compile, hardware.device_type)
    target_keys = ("model", "optimizer", "scheduler", "data", "task")
    bad_targets = target_problems({key: getattr(config, key) for key in target_keys}, config.allowed_targets)
    problems += bad_targets
    problems += sink_and_callback_problems(config)
    if not any(problem.key.startswith("task") for problem in bad_targets):
        problems += monitor_problems(config)
    if problems:
        raise ConfigError(problems)


def sink_and_callback_problems(config: RunConfig) -> list[Problem]:
    """The `logger` and `callbacks` nodes: allowed, importable targets (the same check as the model's), an installed
    package for an optional sink, and callbacks that accept their settings (built here, in the parent, so e.g.
    callbacks.early_stopping.patience=0 fails before any worker starts)."""
    from runner.training.callbacks import build_callbacks
    from runner.training.loggers import extra_problems

    nodes = {**{f"logger.{name}": node for name, node in config.logger.items()},
             **{f"callbacks.{name}": node for name, node in config.callbacks.items()}}
    problems = target_problems(nodes, config.allowed_targets)
    if problems:
        return problems
    problems = extra_problems(config.logger)
    try:
        build_callbacks(config.callbacks)
    except ConfigError as err:
        problems += err.problems
    return problems


def trainer_problems(config: RunConfig) -> list[Problem]:
    trainer, problems = config.trainer, []
    for name in POSITIVE_INTS:
        if getattr(trainer, name) < 1:
            problems.append(Problem(f"trainer.{name}", f"is {getattr(trainer, name)}; it must be 1 or more"))
    for name in POSITIVE_OR_NONE:
        value = getattr(trainer, name)
        if value is not None and value <= 0:
            problems.append(Problem(f"trainer.{name}", f"is {value}; it must be positive, or null to turn it off"))
    if trainer.progress_every_s < 0:
        problems.append(Problem("trainer.progress_every_s", f"is {trainer.progress_every_s}; it must be 0 (a line "
                                                            "every step) or more seconds"))
    return problems


TRAIN_METRICS = ("train/loss", "train/lr", "train/samples_per_s")


def monitor_problems(config: RunConfig) -> list[Problem]:
    """trainer.monitor, and a callback's own `monitor` (early_stopping's), must be a metric the run measures: one the
    task declares (val/<name>) or a training one. (A callback watching a metric never reported would never act.)"""
    from runner.config.instantiate import build_task

    task = build_task(config.task)
    measured = [f"val/{name}" for name in getattr(task, "metric_names", ())] + list(TRAIN_METRICS)
    if config.trainer.max_grad_norm is not None:
        measured.append("train/grad_norm")
    if getattr(task, "tokens_per_sample", None):
        measured.append("train/tokens_per_s")
    if not getattr(task, "metric_names", None):
        return []
    watched = {"trainer.monitor": config.trainer.monitor,
               **{f"callbacks.{name}.monitor": node.get("monitor") for name, node in config.callbacks.items()
                  if isinstance(node, dict) and node.get("monitor") is not None}}
    return [Problem(key, f"'{metric}' is not measured by this run; {type(task).__name__} reports {', '.join(measured)}")
            for key, metric in watched.items() if metric not in measured]


def _ray_problems(hardware, resolved: Hardware, several: bool) -> list[Problem]:
    """launcher=ray: Ray Train starts the workers, so nothing else may have, and Ray places them, not machines."""
    if not several:
        return [Problem("hardware.launcher", f"is ray, which starts several workers; {resolved.kind.value} runs one "
                        "process: use hardware=multi_cpu or multi_gpu (hardware.num_processes is Ray's worker count)")]
    if resolved.external_launcher:
        return [Problem("hardware.launcher", "is ray, but torchrun or srun already started this process as one of "
                        "several: start `python -m runner hardware.launcher=ray ...` once, on the Ray cluster")]
    if hardware.num_machines > 1:
        return [Problem("hardware.num_machines", f"is {hardware.num_machines}; with launcher=ray, Ray places the "
                        "hardware.num_processes workers on its nodes: leave num_machines at 1")]
    return []


# CPU processes per core a run may start: oversubscribing a few times is useful (tests of several ranks on a laptop),
# and a typo (num_processes=1000000) started a million interpreters and wrote a folder for each before failing.
MAX_PROCESSES_PER_CORE = 16


def launch_problems(config: RunConfig, resolved: Hardware) -> list[Problem]:
    """Process counts, machines, rendezvous and timeouts that cannot work together."""
    hardware, problems = config.hardware, []
    if hardware.max_restarts < 0:
        problems.append(Problem("hardware.max_restarts", f"is {hardware.max_restarts}; it must be 0 or more"))
    for name in ("num_processes", "threads_per_process", "num_machines", "timeout_s", "shutdown_timeout_s"):
        value = getattr(hardware, name)
        if value is not None and value < 1:
            problems.append(Problem(f"hardware.{name}", f"is {value}; it must be 1 or more"))
    several = KINDS[resolved.kind].several_processes
    if not several and resolved.external_launcher and resolved.multi_process:
        problems.append(
            Problem("hardware", f"{resolved.kind.value} runs one process, but the launcher (torchrun or srun) started "
                    f"{resolved.world_size}: each would train the whole run on its own. Use hardware=multi_cpu or "
                    "multi_gpu, or start one task")
        )
    elif not several and resolved.multi_process:
        problems.append(
            Problem("hardware", f"{resolved.kind.value} runs one process on one machine; for num_processes="
                    f"{hardware.num_processes}, num_machines={hardware.num_machines} use hardware=multi_cpu or multi_gpu")
        )
    if resolved.multi_process and config.parallel.kind == ParallelKind.none:
        problems.append(Problem("parallel", f"is none, but the run has {resolved.world_size} processes, which would "
                                            "train separate copies of the model; use parallel=ddp or parallel=fsdp"))
    if not 0 <= hardware.machine_rank < max(1, hardware.num_machines):
        problems.append(Problem("hardware.machine_rank", f"is {hardware.machine_rank}; it must be 0 .. num_machines-1 "
                                f"(0 .. {hardware.num_machines - 1})"))
    if hardware.num_machines > 1:
        for name in ("main_process_ip", "main_process_port"):
            if getattr(hardware, name) is None:
                problems.append(Problem(f"hardware.{name}", f"is not set; a run on {hardware.num_machines} machines "
                                        "meets at machine 0's address and a free port on it, the same on every machine"))
        port = hardware.main_process_port
        if port is not None and not 1 <= port <= 65535:
            problems.append(Problem("hardware.main_process_port", f"is {port}; it must be a TCP port, 1 .. 65535, "
                                    "free on machine 0 (the same on every machine)"))
    cores = os.cpu_count() or 1
    if resolved.device_type == "cpu" and not resolved.external_launcher and \
            resolved.processes_per_machine > MAX_PROCESSES_PER_CORE * cores:
        problems.append(Problem("hardware.num_processes", (
            f"is {resolved.processes_per_machine}, more than {MAX_PROCESSES_PER_CORE} per CPU core of this machine "
            f"({cores} cores): each process is a Python interpreter with torch and its own folder of logs; use "
            f"{MAX_PROCESSES_PER_CORE * cores} or fewer (one per core trains fastest)")))
    if hardware.launcher is Launcher.ray:
        problems += _ray_problems(hardware, resolved, several)
    if hardware.start_method is StartMethod.fork and resolved.device_type == "cuda":
        problems.append(Problem("hardware.start_method", "fork is unsafe once CUDA is initialised; use spawn "
                                "(or forkserver) with GPUs"))
    return problems


def checkpoint_problems(config: RunConfig) -> list[Problem]:
    settings, problems = config.checkpoint, []
    for name in ("every_n_steps", "keep_last"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            problems.append(Problem(f"checkpoint.{name}", f"is {value}; it must be 1 or more, or null to turn it off"))
    if settings.keep_best < 0:
        problems.append(Problem("checkpoint.keep_best", f"is {settings.keep_best}; it must be 0 (off) or more"))
    if settings.keep_best > 0 and not settings.enabled:
        problems.append(Problem("checkpoint.keep_best", "needs checkpoint.enabled=true"))
    if settings.init_from is not None:
        from runner.checkpoint.contents import init_weights_file

        try:
            init_weights_file(settings.init_from)
        except ConfigError as err:
            problems += err.problems
    return problems
