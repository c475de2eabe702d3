"""One process's run, top to bottom: join the group, seed, build, prepare, loop, close."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from runner.accelerator import Accelerator, set_seed
from runner.build import build_data, build_model, build_optimizer, build_scheduler, build_task
from runner.checkpoint import Checkpointer, apply_rng, restore
from runner.config import HardwareKind, RunConfig, RunSpec
from runner.data.batches import make_batches
from runner.devices import device_for, resolve_kind
from runner.errors import PREEMPTED_EXIT_CODE, Preempted
from runner.dist import DistInfo, destroy_process_group, init_process_group
from runner.loop import Loop, is_finished, planned_steps
from runner.metrics import Progress, make_logger
from runner.signals import StopSignals

log = logging.getLogger(__name__)


def run(spec: RunSpec) -> dict[str, float]:
    """Entry point of every worker, in-process or started by the elastic launcher. Returns final metrics."""
    dist = DistInfo.from_env()
    device = device_for(spec.config.hardware.kind, dist)
    init_process_group(dist, device.type)
    try:
        accelerator = Accelerator(
            device, spec.config.precision.kind, dist, spec.config.trainer.grad_accum_steps,
            tpu=resolve_kind(spec.config.hardware.kind) is HardwareKind.tpu,
        )
        return train(spec.config, spec.resolved, Path(spec.run_dir), accelerator, spec.resume_from)
    finally:
        destroy_process_group()


def train(config: RunConfig, resolved: dict, run_dir: Path, accelerator: Accelerator,
          resume_from: str | None = None) -> dict[str, float]:
    trainer, is_main = config.trainer, accelerator.is_main_process
    set_seed(config.seed)
    # fp8 swaps Linear layers for Float8Linear: before the optimizer is built from the parameters.
    model = accelerator.convert_precision(build_model(config.model))
    log.info("%s", accelerator.describe())
    if accelerator.precision.speed_warning():
        log.warning("%s", accelerator.precision.speed_warning())
    optimizer = build_optimizer(config.optimizer, model.parameters())
    splits = build_data(config.data)
    train_batches = make_batches(splits["train"], trainer.batch_size, True, config.seed, trainer.data_in_memory_mb)
    val_batches = make_batches(
        splits["validation"], trainer.eval_batch_size or trainer.batch_size, False, config.seed, trainer.data_in_memory_mb
    )
    task = build_task(config.task)
    prepared_model, prepared_optimizer, train_batches, val_batches = accelerator.prepare(
        model, optimizer, train_batches, val_batches
    )
    _, total_steps = planned_steps(trainer, len(train_batches))
    scheduler = accelerator.prepare(build_scheduler(config.scheduler, optimizer, total_steps))

    restored = _restore(resume_from, model, optimizer, scheduler, accelerator, resolved) if resume_from else None
    if restored and is_finished(restored["loop"]["step"], restored["loop"]["epoch"], total_steps, trainer.max_epochs):
        log.info("the run already finished at step %d (%s); nothing to do", restored["loop"]["step"], resume_from)
        return dict(restored["loop"]["last_metrics"])

    logger = make_logger(run_dir, is_main, config.logging.tensorboard, config.logging.jsonl,
                         start_step=restored["loop"]["step"] if restored else 0)
    checkpointer = Checkpointer(run_dir, config.checkpoint, writer=is_main, monitor=trainer.monitor,
                                monitor_mode=trainer.monitor_mode, world_size=accelerator.num_processes, resolved=resolved)
    stop = StopSignals(config.checkpoint.stop_signals, accelerator.dist.is_distributed, accelerator.device)
    loop = Loop(
        accelerator, prepared_model, prepared_optimizer, scheduler, train_batches, val_batches, task, trainer,
        logger=logger,
        progress=Progress(total_steps, enabled=is_main and trainer.progress_bar),
        checkpointer=checkpointer,
        stop=stop,
    )
    if restored:
        loop.load_state_dict(restored["loop"], restored["this_rank"])
        checkpointer.load_state_dict(restored["checkpointer"])
        apply_rng(restored)  # last: nothing after this draws random numbers before training continues
    else:
        logger.log_config(resolved)
    try:
        with stop:
            final = loop.fit()
        logger.log_hparams(resolved, final)
    finally:
        logger.close()
    return final


def _restore(resume_from: str, model, optimizer, scheduler, accelerator: Accelerator, resolved: dict) -> dict:
    """Load the checkpoint the parent chose into the built objects (RNG comes last, in `train`)."""
    restored = restore(Path(resume_from), model, optimizer, scheduler, accelerator.scaler, rank=accelerator.dist.rank,
                       world_size=accelerator.num_processes, resolved=resolved)
    position = restored["loop"]
    log.info("resumed from %s: step %d, epoch %d, batch %d of the epoch", resume_from, position["step"],
             position["epoch"], position["batch_in_epoch"])
    return restored


def run_spawned(spec: RunSpec) -> dict[str, float]:
    """Entry point for a process the elastic launcher started: it inherits neither logging nor thread settings."""
    import torch

    dist = DistInfo.from_env()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.world_size))
    logging.basicConfig(
        level=logging.INFO,
        format=f"[%(asctime)s][rank{dist.rank}][%(name)s][%(levelname)s] - %(message)s",
        handlers=[logging.FileHandler(Path(spec.run_dir) / f"runner_rank{dist.rank}.log"), logging.StreamHandler()],
    )
    try:
        return run(spec)
    except Preempted as stop:
        log.info("%s", stop)
        raise SystemExit(PREEMPTED_EXIT_CODE)  # the launcher reports it; launch.py turns it back into Preempted
