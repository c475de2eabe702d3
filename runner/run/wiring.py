"""The run wiring, in one copy: build the parts of a run from its config, then make the loop that trains them.

    parts = build_parts(config, batch, accelerator)          # model, optimizer, scheduler, batches, task
    loop = make_loop(parts, config, accelerator, run_dir)      # logger, checkpointer, stop signals, progress
    loop.fit()

runner/launch/worker.py runs these in each process; the benchmarks and tests call them too, so what they measure is what
a run does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from runner.accelerate.accelerator import Accelerator, set_seed
from runner.config.instantiate import build_data, build_model, build_optimizer, build_scheduler, build_task
from runner.training.callbacks import RunContext, build_callbacks
from runner.training.checkpointer import Checkpointer
from runner.checkpoint.contents import init_weights_file, load_weights
from runner.checkpoint.files import Layout
from runner.config import ParallelKind, RunConfig, plain
from runner.data.batches import make_batches
from runner.data.shapes import fill_from_data, fit_statistics
from runner.training.debug import fast_dev_run_note, overfit_splits
from runner.distributed.dist import local_main_first
from runner.training.loggers import LogSink, Loggers, NullLogger, RunInfo, make_logger
from runner.training.loop import Loop, planned_steps
from runner.training.metrics import Progress
from runner.accelerate.parallel import prepare_blocks
from runner.training.batch_plan import BatchPlan
from runner.distributed.peak import Peak, device_peak
from runner.distributed.signals import StopSignals
from runner.training.summary import data_summary, model_summary, schedule_summary
from runner.training.throughput import Throughput, count_flops_per_sample

log = logging.getLogger(__name__)


@dataclass
class Parts:
    """A run's objects, built and prepared. `model` and `optimizer` are the user's own (checkpoints save them);
    `prepared_*` are what the Accelerator handed back (DDP, scaler and accumulation wrappers; FSDP shards the
    model in place, so there both are the same module)."""

    model: nn.Module
    optimizer: Any
    prepared_model: nn.Module
    prepared_optimizer: Any
    scheduler: Any
    train_batches: Any
    val_batches: Any
    task: Any
    total_steps: int
    flops_per_sample: float | None = None  # forward and backward of one sample; None: not counted (`counted` says why)
    counted: str = ""


def build_parts(config: RunConfig, batch: BatchPlan, accelerator: Accelerator, splits=None) -> Parts:
    """Everything the loop trains, from the config (`splits`: data already built, e.g. by a benchmark)."""
    trainer = config.trainer
    # The data first: it fills the model's null sizes (in the config itself, so checkpoints and the export record
    # the model that was built) and the statistics of its Standardize layers (runner/data/shapes.py).
    if splits is None:
        with local_main_first(accelerator.dist):
            splits = build_data(config.data)
    config.model = fill_from_data(config.model, splits["train"], config.task)
    set_seed(config.seed)
    model = build_model(config.model)
    fit_statistics(model, splits["train"], config.task)
    # After the statistics: the weights' own buffers replace them. A resume then loads its checkpoint over these
    # (runner/launch/worker.py restores after build_parts), so a preempted fine-tune continues, not restarts.
    if config.checkpoint.init_from is not None:
        weights = init_weights_file(config.checkpoint.init_from)
        load_weights(weights, model, "checkpoint.init_from")
        log.info("the model starts from the weights in %s (optimizer, schedule and step start fresh)", weights)
    splits = overfit_splits(splits, trainer, batch)  # after the model is sized from the whole training split
    train_batches = make_batches(splits["train"], batch.per_device, trainer.overfit_batches is None, config.seed,
                                 trainer.data_in_memory_mb)
    val_batches = make_batches(splits["validation"], trainer.eval_batch_size or batch.per_device, False, config.seed,
                               trainer.data_in_memory_mb)
    task = build_task(config.task)
    # Counted on the plain model, before precision, checkpointing or compile wrap it (runner/training/throughput.py).
    flops_per_sample, counted = count_flops_per_sample(model, task, next(iter(train_batches)))
    # fp8 swaps Linear layers for Float8Linear: before the optimizer is built from the parameters.
    model = accelerator.convert_precision(model)
    log.info("%s", model_summary(model))
    # Activation checkpointing and torch.compile go on the blocks before FSDP shards them (in prepare).
    model = prepare_blocks(model, config.activation_checkpointing, config.compile, config.parallel,
                           accelerator.shards_parameters)
    log.info("%s", accelerator.describe())
    if config.parallel.kind is ParallelKind.fsdp and not accelerator.shards_parameters:
        # Allowed on purpose: it is how a sharded checkpoint continues on one device (and how a run starts that
        # several processes will continue).
        log.info("parallel=fsdp on one process: nothing is sharded; checkpoints are written sharded all the same, "
                 "so any number of processes can continue them")
    if accelerator.precision.speed_warning():
        log.warning("%s", accelerator.precision.speed_warning())
    log.info("%s", batch.describe())
    optimizer = build_optimizer(config.optimizer, model)
    log.info("%s", data_summary(splits))
    prepared_model, prepared_optimizer, train_batches, val_batches = accelerator.prepare(
        model, optimizer, train_batches, val_batches
    )
    check_fit(task, accelerator, prepared_model, train_batches, config.model, config.data)
    steps_per_epoch, total_steps = planned_steps(trainer, len(train_batches), batch.accumulation)
    log.info("%s", schedule_summary(steps_per_epoch, total_steps, trainer.max_epochs))
    scheduler = accelerator.prepare(build_scheduler(config.scheduler, optimizer, total_steps))
    return Parts(model, optimizer, prepared_model, prepared_optimizer, scheduler, train_batches, val_batches, task,
                 total_steps, flops_per_sample, counted)


def make_loop(parts: Parts, config: RunConfig, batch: BatchPlan, accelerator: Accelerator, run_dir: Path, *,
              start_step: int = 0, checkpoints: bool = True) -> Loop:
    """The loop over the parts, with its loggers, callbacks, checkpointer, stop signals and progress bar (rank 0
    writes; a debug run, trainer.fast_dev_run, writes nothing but its log)."""
    trainer, is_main = config.trainer, accelerator.is_main_process
    writes = trainer.fast_dev_run is None
    if not writes:
        log.info("%s", fast_dev_run_note(trainer))
    run = RunInfo(config.logging.name or run_dir.name, tuple(config.logging.tags), config.logging.notes)
    logger = (make_logger(run_dir, is_main, config.logger, config.logging.jsonl, start_step, run) if writes
              else Loggers([LogSink()]) if is_main else NullLogger())
    callbacks = build_callbacks(config.callbacks, RunContext(run_dir, accelerator.dist.rank, is_main and writes))
    checkpointer = (Checkpointer(run_dir, config.checkpoint, writer=is_main, monitor=trainer.monitor,
                                 monitor_mode=trainer.monitor_mode, world_size=accelerator.num_processes,
                                 resolved=plain(config), layout=checkpoint_layout(config))
                    if checkpoints and writes else Checkpointer.disabled())
    # The peak is looked up (on a CPU, measured once per machine) only where there are FLOPs to divide by it.
    peak = (device_peak(accelerator.device, config.precision.kind.value) if parts.flops_per_sample
            else Peak(None, "no FLOP count"))
    throughput = Throughput(parts.flops_per_sample, peak, parts.counted)
    log.info("%s", throughput.describe(getattr(parts.task, "tokens_per_sample", None)))
    return Loop(
        accelerator, parts.prepared_model, parts.prepared_optimizer, parts.scheduler, parts.train_batches,
        parts.val_batches, parts.task, trainer, batch,
        logger=logger,
        progress=Progress(parts.total_steps, enabled=is_main and trainer.progress_bar,
                          line_every_s=trainer.progress_every_s),
        checkpointer=checkpointer,
        stop=StopSignals(config.checkpoint.stop_signals, accelerator.dist.is_distributed),
        callbacks=callbacks,
        throughput=throughput,
    )


def checkpoint_layout(config: RunConfig) -> Layout:
    """parallel=fsdp checkpoints are sharded (even from one process: they may be resumed on several)."""
    return Layout.dcp if config.parallel.kind == ParallelKind.fsdp else Layout.safetensors


def check_fit(task, accelerator: Accelerator, model, train_batches, model_node: dict, data_node: dict) -> None:
    """Before the first step, one batch through the model (on every rank, under the run's autocast): a model that
    does not fit the data fails with the key to change (see Task.check_fit)."""
    check = getattr(task, "check_fit", None)
    if check is None:
        return
    module = accelerator.unwrap_model(model)
    module.eval()
    try:
        with accelerator.autocast():
            check(module, next(iter(train_batches)), model_node, data_node)
    finally:
        module.train()
