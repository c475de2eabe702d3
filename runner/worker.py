"""One process's run, top to bottom: join the group, seed, build, prepare, loop, close."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from runner.accelerator import Accelerator, set_seed
from runner.build import build_data, build_model, build_optimizer, build_scheduler, build_task
from runner.checkpoint import Checkpointer, load_checkpoint
from runner.config import HardwareKind, RunConfig, RunSpec
from runner.data.batches import make_batches
from runner.devices import device_for, resolve_kind
from runner.dist import DistInfo, destroy_process_group, init_process_group
from runner.loop import Loop, TrainState, planned_steps
from runner.metrics import Progress, make_logger

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
        return train(spec.config, spec.resolved, Path(spec.run_dir), accelerator)
    finally:
        destroy_process_group()


def train(config: RunConfig, resolved: dict, run_dir: Path, accelerator: Accelerator) -> dict[str, float]:
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

    logger = make_logger(run_dir, is_main, config.logging.tensorboard, config.logging.jsonl)
    loop = Loop(
        accelerator, prepared_model, prepared_optimizer, scheduler, train_batches, val_batches, task, trainer,
        logger=logger,
        progress=Progress(total_steps, enabled=is_main and trainer.progress_bar),
        checkpointer=Checkpointer(run_dir / "checkpoints", enabled=is_main and config.checkpoint.enabled),
        checkpoint_every_epoch=config.checkpoint.every_epoch,
    )
    if config.resume:
        loop.state = TrainState(**load_checkpoint(Path(config.resume), model, optimizer, scheduler, accelerator.scaler))
        log.info("resumed from %s at step %d", config.resume, loop.state.step)
    logger.log_config(resolved)
    final = loop.fit()
    logger.log_hparams(resolved, final)
    logger.close()
    return final


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
    return run(spec)
