"""The standard loop: train steps, evaluation on a cadence, logging, checkpoints. It builds nothing, reads no files.

The hot path does no host-device sync: losses add up on the device and are read once per `log_every_steps`.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import asdict, dataclass, replace

import torch

from runner.training.callbacks import Callbacks
from runner.config import NonFinitePolicy, TrainerConfig
from runner.distributed.dist import all_reduce_sum
from runner.errors import NonFiniteLoss, Preempted, ResumeRefused
from runner.training.batch_plan import BatchPlan
from runner.distributed.peak import Peak
from runner.distributed.signals import NoStopSignals
from runner.training.throughput import Throughput

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where training stands: optimizer steps taken, the epoch in progress, and the micro-batches of that epoch
    already trained on (a resumed run starts its epoch there, without reading them again)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


def planned_steps(settings: TrainerConfig, batches_per_epoch: int, accumulation: int) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps) for these settings and micro-batches per step."""
    if settings.limit_train_batches is not None:
        batches_per_epoch = min(batches_per_epoch, settings.limit_train_batches)
    steps_per_epoch = max(1, batches_per_epoch // accumulation)
    total = steps_per_epoch * settings.max_epochs
    for limit in (settings.max_steps, settings.fast_dev_run):  # fast_dev_run: N steps in all
        if limit is not None:
            total = min(total, limit)
    return steps_per_epoch, total


def is_finished(step: int, epoch: int, total_steps: int, max_epochs: int) -> bool:
    return step >= total_steps or epoch >= max_epochs


def parameters_are_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(parameter).all()) for parameter in model.parameters())


class EvaluationStopped(Exception):
    """A stop signal arrived during an evaluation, which was abandoned (Loop.evaluate_and_log saves and stops)."""

    def __init__(self, batches_done: int):
        super().__init__(f"evaluation abandoned after {batches_done} batch(es)")
        self.batches_done = batches_done


def evaluate(accelerator, model, batches, task, limit: int | None = None, stop=None) -> dict[str, float]:
    """The task's metrics over every batch (the first `limit` when given), summed exactly across processes, as
    `val/<name>`. With `stop` (the loop's StopSignals), a stop signal is checked before each batch that every rank
    reaches, and raises EvaluationStopped on all ranks at the same batch."""
    # The unwrapped module: DDP's forward may sync buffers with the peers, and evaluation shards are not padded,
    # so ranks can run different numbers of eval batches; a collective inside them would hang.
    model = accelerator.unwrap_model(model)
    model.eval()
    totals: dict[str, torch.Tensor] = {}
    # Under FSDP a forward is a collective: a rank with fewer rows repeats its last batch (results dropped).
    count = len(batches) if limit is None else min(limit, len(batches))
    extra = accelerator.forwards_to_match(count)
    checks = stop.agreed_checks(count) if stop is not None else 0
    batch = None
    with torch.no_grad(), accelerator.autocast():
        for index, batch in enumerate(batches if limit is None else itertools.islice(batches, limit)):
            if index < checks and stop.requested():
                model.train()
                raise EvaluationStopped(index)
            for name, value in task.evaluation_stats(model, batch).items():
                totals[name] = totals[name] + value if name in totals else value
        if batch is None:  # this process's shard is empty (fewer rows than processes): zero stats, same keys
            batch = batches.stand_in()
            totals = {name: torch.zeros_like(value) for name, value in task.evaluation_stats(model, batch).items()}
            extra = max(extra - 1, 0)  # that forward was one of those FSDP needed
        for _ in range(extra):
            task.evaluation_stats(model, batch)
    model.train()
    for value in totals.values():
        all_reduce_sum(value)
    return {f"val/{name}": value for name, value in task.summarize(totals).items()}


class Loop:
    """One training run over prepared objects. `fit()` returns the final validation metrics.

    Everything that makes a resumed run continue exactly (position, the loss window being averaged, the last
    evaluation) is in `state_dict()`; the checkpointer decides when to save and `stop` when to stop early."""

    def __init__(self, accelerator, model, optimizer, scheduler, train_batches, val_batches, task,
                 settings: TrainerConfig, batch: BatchPlan, *, logger, progress, checkpointer, stop=None,
                 callbacks: Callbacks | None = None, throughput: Throughput | None = None):
        self.accelerator = accelerator
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.train_batches, self.val_batches, self.task = train_batches, val_batches, task
        self.settings = settings
        self.logger, self.progress, self.checkpointer = logger, progress, checkpointer
        self.stop = stop or NoStopSignals()
        self.callbacks = callbacks or Callbacks()
        self.stop_reason: str | None = None  # set by a callback (request_stop): the run ends after this step
        self.accumulation = batch.accumulation
        self.steps_per_epoch, self.total_steps = planned_steps(settings, len(train_batches), batch.accumulation)
        self.samples_per_micro_batch = batch.per_device * batch.processes
        # Read once: a task whose samples have a fixed length in tokens (language models) gets tokens/s logged.
        self.tokens_per_sample = getattr(task, "tokens_per_sample", None)
        self.throughput = throughput or Throughput(None, Peak(None, ""), "not counted")
        self.state = TrainState()
        self.last_eval_step, self.last_metrics = -1, {}
        self.step_metrics: dict[str, float] = {}  # everything logged at the current step (for keep-best)
        self.last_saved: TrainState | None = None
        self.running_loss = torch.zeros((), device=accelerator.device)
        self.window_micro_batches = 0
        self.window_start = time.perf_counter()  # of the loss window being averaged (for samples/s)
        self.completing = False  # True while complete() finishes the end of a run that had already finished
        self.skip_nonfinite = settings.on_nonfinite == NonFinitePolicy.skip
        self.skipped_steps = 0
        self.last_finite_loss: tuple[int, float] | None = None  # (step, train/loss) of the last finite log

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None or is_finished(self.state.step, self.state.epoch, self.total_steps,
                                                           self.settings.max_epochs)

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (evaluate, save the final checkpoint): for callbacks."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.info("%s", reason)

    def fit(self) -> dict[str, float]:
        with self.stop:
            try:
                return self._fit()
            except KeyboardInterrupt:
                self.checkpointer.settle_after_interrupt()
                raise

    def _fit(self) -> dict[str, float]:
        self.progress.start(self.state.step)
        self.callbacks.on_fit_start(self)
        if self.evaluation_pending():
            self.evaluate_and_log()
        while not self.finished:
            self.train_epoch()
            if self.finished:
                break
            if self.settings.eval_every_steps is None:
                self.evaluate_and_log()
            evaluated = self.last_eval_step == self.state.step  # here, or on the epoch's last step
            if self.checkpointer.every_epoch or self.checkpointer.due(self.state.step, evaluated):
                self.save()
        final = self.last_metrics if self.last_eval_step == self.state.step else self.evaluate_and_log()
        if self.skipped_steps:
            log.warning("trainer.on_nonfinite=skip skipped %d optimizer step(s) with non-finite gradients in this "
                        "invocation; a run that skips most of its steps is not learning: lower optimizer.lr or clip "
                        "(trainer.max_grad_norm)", self.skipped_steps)
        self.end(final)
        return final

    def end(self, final: dict[str, float]) -> None:
        """The end of a run, in one order: the final checkpoint with its exports (or, when this step was saved
        already, the exports from that checkpoint), sealed on every rank, then the callbacks' on_fit_end (the EMA
        export). Each of these can be done again by complete()."""
        self.save(final=True)
        self.checkpointer.wait()
        self.callbacks.on_fit_end(self, final)
        self.progress.close()

    def complete(self) -> dict[str, float]:
        """The end of a run that had already finished, restored from its last checkpoint (`resume=auto`): the final
        evaluation if that checkpoint holds none, then whatever final artifact is missing (the final export, a
        callback's export such as EMA's), each only if missing: a run stopped by a full disk during its final export,
        or whose export was deleted, gets it without training again. Returns the final metrics."""
        self.completing = True
        self.callbacks.on_fit_start(self)
        final = self.last_metrics if self.last_eval_step == self.state.step else self.evaluate_and_log()
        # final.json records the monitored value: the checkpoint's last evaluation is this step's.
        self.checkpointer.export_missing(self.accelerator.unwrap_model(self.model), self.position(),
                                         {**final, **self._metrics_at_step()})
        self.checkpointer.wait()
        self.callbacks.on_fit_end(self, final)
        self.progress.close()
        return final

    def train_epoch(self) -> None:
        """Train until the epoch ends (then count it) or the step budget is spent."""
        accumulate = self.accumulation
        start = self.state.batch_in_epoch
        if start == 0:  # a new epoch starts a new loss window; a resumed one continues the restored window
            self.running_loss.zero_()
            self.window_micro_batches = 0
        self.train_batches.set_epoch(self.state.epoch, start)
        epoch_batches = self.steps_per_epoch * accumulate  # the tail after it cannot fill a whole accumulation cycle
        self.window_start = time.perf_counter()
        for index, batch in enumerate(self.train_batches, start=start):
            if index >= epoch_batches:
                break
            loss = self.micro_step(batch)
            # on_nonfinite=skip reads every loss (a sync per micro-batch); otherwise a NaN or inf propagates
            # into the window's sum, which is read at the log step anyway.
            if not self.skip_nonfinite or torch.isfinite(loss).item():
                self.running_loss += loss.detach()
                self.window_micro_batches += 1
            if not self.accelerator.sync_gradients:
                continue
            grad_norm = self.optimizer_step()
            self.state.step += 1
            self.state.batch_in_epoch = index + 1
            self.progress.update()
            epoch_ends = index + 1 == epoch_batches  # then fit() evaluates (if by epoch) and saves after the epoch
            self.after_step(grad_norm, epoch_ends)
            if self.stop_reason is not None:
                return  # a callback ended the run inside the epoch: it does not count as done
            if self.state.step >= self.total_steps:
                if not epoch_ends:
                    return  # stopped inside the epoch: it does not count as done
                break
        self.state.epoch += 1
        self.state.batch_in_epoch = 0

    def after_step(self, grad_norm: torch.Tensor | None, epoch_ends: bool) -> None:
        """A step's events after its optimizer step, in the one order callbacks rely on (runner.training.callbacks.Callback):
        the callbacks' on_step_end, then logging and evaluation, then the checkpoint, then the stop check.

        The checkpoint comes after on_step_end so that it holds the callbacks' state with this step counted (an EMA
        update, a user's tally): a run resumed from it continues exactly as an uninterrupted one. At the end of an
        epoch `fit()` evaluates (when not by steps) and saves after this, in the same order."""
        settings, step = self.settings, self.state.step
        self.callbacks.on_step_end(self)
        if step % settings.log_every_steps == 0 or step == self.total_steps:
            self.log_train(self.window_micro_batches, self.window_start, grad_norm)
            self.running_loss.zero_()
            self.window_micro_batches, self.window_start = 0, time.perf_counter()
        evaluated = bool(settings.eval_every_steps and step % settings.eval_every_steps == 0)
        if evaluated:
            self.evaluate_and_log()
        if not epoch_ends and step < self.total_steps and self.checkpointer.due(step, evaluated):
            self.save()
        if self.stop.requested():
            self.stop_now()

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
        if self.skip_nonfinite and not self.gradients_are_finite(grad_norm):
            self.skipped_steps += 1  # the same decision on every rank: gradients are averaged across them
            if self.skipped_steps == 1:
                log.warning("step %d: non-finite gradients, the step is skipped (trainer.on_nonfinite=skip); the "
                            "skips are counted in train/skipped_steps and at the end", self.state.step + 1)
            self.optimizer.zero_grad(set_to_none=True)
            return grad_norm
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def gradients_are_finite(self, grad_norm: torch.Tensor | None) -> bool:
        if grad_norm is None:
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), float("inf"))
        return bool(torch.isfinite(grad_norm).item())

    def log_train(self, micro_batches: int, window_start: float, grad_norm) -> None:
        elapsed = max(time.perf_counter() - window_start, 1e-9)
        total = all_reduce_sum(self.running_loss).item()
        # Every micro-batch of the window skipped (on_nonfinite=skip): there is no loss to show.
        loss = total / (micro_batches * self.accelerator.num_processes) if micro_batches else float("nan")
        if not math.isfinite(loss):
            self.nonfinite_loss(loss)
        else:
            self.last_finite_loss = (self.state.step, loss)
        metrics = {
            "train/loss": loss,
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "train/samples_per_s": micro_batches * self.samples_per_micro_batch / elapsed,
        }
        if self.tokens_per_sample:
            metrics["train/tokens_per_s"] = metrics["train/samples_per_s"] * self.tokens_per_sample
        metrics.update(self.throughput.metrics(metrics["train/samples_per_s"], self.accelerator.num_processes))
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        if self.skip_nonfinite:
            metrics["train/skipped_steps"] = float(self.skipped_steps)
        self.log(metrics)
        self.progress.show({"loss": metrics["train/loss"], "samples/s": metrics["train/samples_per_s"]})

    def evaluate_metrics(self, stoppable: bool = False) -> dict[str, float]:
        """The validation metrics of the model as it is now (at most trainer.limit_val_batches batches). Only the
        loop's own evaluation is `stoppable`: a callback's (EMA's, on swapped-in weights) runs to its end, since
        saving in the middle of it would save the swapped weights."""
        limit = self.settings.limit_val_batches or self.settings.fast_dev_run
        return evaluate(self.accelerator, self.model, self.val_batches, self.task, limit,
                        stop=self.stop if stoppable else None)

    def evaluation_pending(self) -> bool:
        """A stop signal abandoned the evaluation this step was due (evaluate_and_log saved the step without it):
        the resumed run evaluates first, so its log and callbacks see what an uninterrupted run's saw. An evaluation
        at the last step is the final one, which fit() and complete() do anyway."""
        step = self.state.step
        if step == 0 or self.last_eval_step == step or self.finished:
            return False
        if self.settings.eval_every_steps:
            return step % self.settings.eval_every_steps == 0
        return self.state.batch_in_epoch == 0  # by epoch: it ended, and its evaluation did not

    def evaluate_and_log(self) -> dict[str, float]:
        try:
            metrics = self.evaluate_metrics(stoppable=True)
        except EvaluationStopped as stopped:
            log.info("%s during the evaluation at step %d: evaluation abandoned after %d batch(es); it runs again "
                     "after resume=auto", self.stop.name, self.state.step, stopped.batches_done)
            self.stop_now()  # saves this step (without the evaluation) and raises Preempted
        self.log(metrics)
        self.last_eval_step, self.last_metrics = self.state.step, metrics
        log.info("step %d: %s", self.state.step, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        self.callbacks.on_eval_end(self, metrics)
        return metrics

    def log(self, metrics: dict[str, float]) -> None:
        if self.step_metrics.get("step") != self.state.step:
            self.step_metrics = {"step": self.state.step}
        self.step_metrics.update(metrics)
        self.logger.log(self.state.step, metrics)

    def nonfinite_loss(self, value: float) -> None:
        """The window's training loss is NaN or inf: stop before it reaches a checkpoint (on_nonfinite=stop)."""
        if self.settings.on_nonfinite != NonFinitePolicy.stop:
            return
        if self.accelerator.scaler is not None and parameters_are_finite(self.model):
            log.warning("step %d: a non-finite fp16 loss; the grad scaler skipped those steps", self.state.step)
            return
        last = ("no finite loss was logged before" if self.last_finite_loss is None
                else "the last finite train/loss was %.4g at step %d" % self.last_finite_loss[::-1])
        raise NonFiniteLoss(
            f"trainer.on_nonfinite: the training loss became {value} by optimizer step {self.state.step} ({last}); "
            "the run stopped before saving anything trained on it. Lower optimizer.lr, clip "
            "gradients with trainer.max_grad_norm, or set trainer.on_nonfinite=skip to skip such steps"
        )

    def _metrics_at_step(self) -> dict[str, float]:
        metrics = self.step_metrics if self.step_metrics.get("step") == self.state.step else {}
        return {name: value for name, value in metrics.items() if name != "step"}

    def save(self, final: bool = False) -> None:
        if self.last_saved == self.state:
            # Nothing happened since (a stop signal or an early stop right after a scheduled save): no second
            # checkpoint of this step, but the end of the run still gets its exports, from that checkpoint.
            if final:
                self.checkpointer.export_saved(self.accelerator.unwrap_model(self.model), self.position(),
                                               self._metrics_at_step())
            return
        if self.settings.on_nonfinite == NonFinitePolicy.stop and self.checkpointer.enabled:
            # A NaN since the last log must not become the newest checkpoint: look now (all ranks, one number).
            window = all_reduce_sum(self.running_loss.detach().clone()).item()
            if not math.isfinite(window):
                self.nonfinite_loss(window)
        if self.checkpointer.enabled and hasattr(self.logger, "flush"):  # optional, as for a sink of your own
            # What was logged up to this checkpoint reaches the sinks first: a run killed after it resumes from
            # here and logs only the steps after.
            self.logger.flush()
        path = self.checkpointer.save(self.accelerator.unwrap_model(self.model), self.state_dict(), self.position(),
                                      self._metrics_at_step(), final=final, optimizer=self.optimizer)
        self.last_saved = replace(self.state)
        if path is not None:
            log.info("checkpoint saved: %s", path)
        self.callbacks.on_save(self, path)

    def stop_now(self) -> None:
        """A stop signal arrived: save where we are (unless just saved) and leave the run through Preempted."""
        self.save()
        self.checkpointer.wait()  # sealed, and every rank here, before any process exits
        self.progress.close()
        raise Preempted(self.stop.name, self.state.step, self.checkpointer.last_path)

    def position(self) -> dict:
        """Where training stands, for a checkpoint's manifest: the state, and the epoch's progress in samples of the
        global batch, which is what a run on another number of processes continues from (load_state_dict)."""
        return {**asdict(self.state), "samples_in_epoch": self.state.batch_in_epoch * self.samples_per_micro_batch,
                "global_batch": self.samples_per_micro_batch * self.accumulation}

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly like this one, but the model and the optimizer (the
        checkpointer saves those, whole or sharded)."""
        return {
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.accelerator.scaler.state_dict() if self.accelerator.scaler is not None else None,
            "per_rank": {"running_loss": self.running_loss.detach().cpu()},  # each rank's own share of the window
            "loop": {
                **asdict(self.state),
                "accumulation": self.accumulation,
                "steps_per_epoch": self.steps_per_epoch,
                "per_device": self.samples_per_micro_batch // self.accelerator.num_processes,
                "processes": self.accelerator.num_processes,
                "window_micro_batches": self.window_micro_batches,
                "last_eval_step": self.last_eval_step,
                "last_metrics": dict(self.last_metrics),
                "stop_reason": self.stop_reason,
                "callbacks": self.callbacks.state_dict(),
            },
        }

    def load_state_dict(self, loop_state: dict, this_rank: dict) -> None:
        """The "loop" and this process's "per_rank" parts of `state_dict()` (model, optimizer, scheduler and
        scaler are restored by the caller)."""
        # Positions count micro-batches, each `samples_per_micro_batch` samples of the global order across the
        # processes; on another process count or accumulation a micro-batch holds another number of samples.
        # Checkpoints are taken between optimizer steps and the global batch is the same (refuse_inexact_resume),
        # so whole steps convert exactly, in samples.
        saved_accumulation = loop_state.get("accumulation", self.accumulation)  # absent in older checkpoints
        saved_processes = loop_state.get("processes", self.accelerator.num_processes)
        global_batch = self.samples_per_micro_batch * self.accumulation
        saved_per_micro_batch = global_batch // saved_accumulation

        def scale(micro_batches: int) -> int:
            return micro_batches * saved_per_micro_batch // self.samples_per_micro_batch

        saved_steps = loop_state.get("steps_per_epoch", self.steps_per_epoch)
        if saved_processes != self.accelerator.num_processes and saved_steps != self.steps_per_epoch:
            raise ResumeRefused(
                f"resume: the checkpoint's run took {saved_steps} optimizer steps per epoch on {saved_processes} "
                f"process(es), and this run's split of the same global batch takes {self.steps_per_epoch}: the "
                "epoch's rows are not a multiple of the global batch, and its last, partial batch is a smaller step "
                "without accumulation but dropped by an accumulation cycle, so the steps and the schedule would not "
                f"be the uninterrupted run's. Resume with hardware.num_processes={saved_processes}, or with the "
                "accumulation the checkpoint's run used (trainer.micro_batch_size)")
        self.state = TrainState(loop_state["step"], loop_state["epoch"], scale(loop_state["batch_in_epoch"]))
        # Each rank's sum of micro-batch losses (this_rank: the writers' mean when the count changed): scaled so
        # that the window's logged mean stays the one an uninterrupted run logs.
        self.running_loss = (this_rank["running_loss"].to(self.accelerator.device) * saved_per_micro_batch
                             / self.samples_per_micro_batch)
        self.window_micro_batches = scale(loop_state["window_micro_batches"])
        if saved_processes != self.accelerator.num_processes and self.accelerator.is_main_process:
            per_device = self.samples_per_micro_batch // self.accelerator.num_processes
            log.info("resume: written by %d process(es) (%d per device x %d accumulation step(s)), continued on %d "
                     "(%d x %d): the global batch of %d is the same, so training goes on from sample %d of epoch %d "
                     "with the same rows in the same order; process r continues the random generators of rank r "
                     "mod %d", saved_processes, loop_state.get("per_device", saved_per_micro_batch // saved_processes),
                     saved_accumulation, self.accelerator.num_processes, per_device, self.accumulation, global_batch,
                     self.state.batch_in_epoch * self.samples_per_micro_batch, self.state.epoch, saved_processes)
        self.last_eval_step, self.last_metrics = loop_state["last_eval_step"], dict(loop_state["last_metrics"])
        # Checkpoints written before callbacks existed hold neither key.
        self.stop_reason = loop_state.get("stop_reason")
        self.callbacks.load_state_dict(loop_state.get("callbacks", {}))
        self.last_saved = replace(self.state)
