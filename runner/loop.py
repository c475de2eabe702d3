"""The standard loop: train steps, evaluation on a cadence, logging, checkpoints. It builds nothing, reads no files.

The hot path does no host-device sync: losses add up on the device and are read once per `log_every_steps`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from runner.config import TrainerConfig
from runner.dist import all_reduce_sum

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where training stands: optimizer steps taken and the epoch in progress."""

    step: int = 0
    epoch: int = 0


def planned_steps(settings: TrainerConfig, batches_per_epoch: int) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps) for these settings."""
    steps_per_epoch = max(1, batches_per_epoch // settings.grad_accum_steps)
    total = steps_per_epoch * settings.max_epochs
    if settings.max_steps is not None:
        total = min(total, settings.max_steps)
    return steps_per_epoch, total


def evaluate(accelerator, model, batches, task) -> dict[str, float]:
    """The task's metrics over every batch, summed exactly across processes, as `val/<name>`."""
    model.eval()
    totals: dict[str, torch.Tensor] = {}
    with torch.no_grad(), accelerator.autocast():
        for batch in batches:
            for name, value in task.evaluation_stats(model, batch).items():
                totals[name] = totals[name] + value if name in totals else value
    model.train()
    for value in totals.values():
        all_reduce_sum(value)
    return {f"val/{name}": value for name, value in task.summarize(totals).items()}


class Loop:
    """One training run over prepared objects. `fit()` returns the final validation metrics."""

    def __init__(self, accelerator, model, optimizer, scheduler, train_batches, val_batches, task,
                 settings: TrainerConfig, logger, progress, checkpointer, checkpoint_every_epoch: bool):
        self.accelerator = accelerator
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.train_batches, self.val_batches, self.task = train_batches, val_batches, task
        self.settings = settings
        self.logger, self.progress, self.checkpointer = logger, progress, checkpointer
        self.checkpoint_every_epoch = checkpoint_every_epoch
        self.steps_per_epoch, self.total_steps = planned_steps(settings, len(train_batches))
        self.samples_per_micro_batch = settings.batch_size * accelerator.num_processes
        self.state = TrainState()
        self.last_eval_step, self.last_metrics = -1, {}

    def fit(self) -> dict[str, float]:
        self.progress.update(self.state.step)
        while self.state.step < self.total_steps and self.state.epoch < self.settings.max_epochs:
            self.train_epoch()
            if self.state.step >= self.total_steps or self.state.epoch >= self.settings.max_epochs:
                break
            if self.settings.eval_every_steps is None:
                self.evaluate_and_log()
            if self.checkpoint_every_epoch:
                self.save()
        final = self.last_metrics if self.last_eval_step == self.state.step else self.evaluate_and_log()
        self.save()
        self.progress.close()
        return final

    def train_epoch(self) -> None:
        """Train until the epoch ends (then count it) or the step budget is spent."""
        settings, accumulate = self.settings, self.settings.grad_accum_steps
        self.train_batches.set_epoch(self.state.epoch)
        running_loss = torch.zeros((), device=self.accelerator.device)
        micro_batches, window_start = 0, time.perf_counter()
        for index, batch in enumerate(self.train_batches):
            if index >= self.steps_per_epoch * accumulate:
                break  # the tail that cannot fill a whole accumulation cycle
            loss = self.micro_step(batch)
            running_loss += loss.detach()
            micro_batches += 1
            if not self.accelerator.sync_gradients:
                continue
            grad_norm = self.optimizer_step()
            self.state.step += 1
            self.progress.update()
            if self.state.step % settings.log_every_steps == 0 or self.state.step == self.total_steps:
                self.log_train(running_loss, micro_batches, window_start, grad_norm)
                running_loss.zero_()
                micro_batches, window_start = 0, time.perf_counter()
            if settings.eval_every_steps and self.state.step % settings.eval_every_steps == 0:
                self.evaluate_and_log()
            if self.state.step >= self.total_steps:
                if index + 1 < self.steps_per_epoch * accumulate:
                    return  # stopped inside the epoch: it does not count as done
                break
        self.state.epoch += 1

    def micro_step(self, batch) -> torch.Tensor:
        # accumulate() skips DDP's gradient all-reduce on all but the last micro-batch of a cycle;
        # backward() divides the loss over the cycle (and scales it under fp16).
        with self.accelerator.accumulate(self.model):
            with self.accelerator.autocast():
                loss = self.task.training_loss(self.model, batch)
            self.accelerator.backward(loss)
        return loss

    def optimizer_step(self) -> torch.Tensor | None:
        grad_norm = None
        if self.settings.max_grad_norm is not None:
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def log_train(self, running_loss: torch.Tensor, micro_batches: int, window_start: float, grad_norm) -> None:
        elapsed = max(time.perf_counter() - window_start, 1e-9)
        metrics = {
            "train/loss": all_reduce_sum(running_loss).item() / (micro_batches * self.accelerator.num_processes),
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "train/samples_per_s": micro_batches * self.samples_per_micro_batch / elapsed,
        }
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        self.logger.log(self.state.step, metrics)
        self.progress.show({"loss": metrics["train/loss"], "samples/s": metrics["train/samples_per_s"]})

    def evaluate_and_log(self) -> dict[str, float]:
        metrics = evaluate(self.accelerator, self.model, self.val_batches, self.task)
        self.logger.log(self.state.step, metrics)
        self.last_eval_step, self.last_metrics = self.state.step, metrics
        log.info("step %d: %s", self.state.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        return metrics

    def save(self) -> None:
        model = self.accelerator.unwrap_model(self.model)
        path = self.checkpointer.save(self.state.step, self.state.epoch, model, self.optimizer, self.scheduler,
                                      self.accelerator.scaler)
        if path is not None:
            log.info("checkpoint saved: %s", path)
