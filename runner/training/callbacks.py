"""Callbacks: code that runs at the loop's events, chosen in the config group `callbacks` (a list).

    callbacks=[early_stopping,ema]                      # conf/callbacks/*.yaml, each fills callbacks.<name>
    callbacks.early_stopping.patience=5                 # a setting of one of them
    +callbacks.mine._target_=mylab.callbacks.Mine       # your own (add mylab. to allowed_targets)

The hooks, each called on every process with the loop (its `state`, `model`, `optimizer`, `settings`, `log()`):

    on_fit_start(loop)            before the first step (also of a resumed run)
    on_step_end(loop)             after each optimizer step (loop.state.step is the step just taken)
    on_eval_end(loop, metrics)    after each evaluation, with its val/* metrics (the same on every process)
    on_save(loop, path)           after a checkpoint was saved (path: None on processes that do not write)
    on_fit_end(loop, final)       after the last evaluation and the final checkpoint

The order of a step's events is fixed (runner.training.loop.Loop.after_step): the optimizer step, then every callback's
on_step_end, then logging and evaluation (on_eval_end), then the checkpoint (on_save), then the stop check. So a
checkpoint holds each callback's `state_dict()` with the step counted, and a run resumed from it (kill -9, then
resume=auto) continues exactly: keep in `state_dict()` whatever on_step_end changes.

`resume=auto` on a run that had finished, but lacks a final artifact (an export deleted, or not written because the
disk was full), restores its last checkpoint and calls on_fit_start and on_fit_end again, without training, with
`loop.completing` true: write then only what is missing.

`loop.request_stop(reason)` ends the run after the current step: it evaluates, saves a final checkpoint and
records the reason in the log (and in result.json for early stopping). Call it on every process alike (decide
from values that are the same everywhere, such as evaluation metrics), or the processes part ways. A callback
that writes files does so through `self.run` (a RunContext): `run.writes_files` is true on the main process of a
real run and false elsewhere and in debug runs (trainer.fast_dev_run).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from runner.errors import ConfigError, write_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    """What a callback may need beyond the loop: where the run writes, and whether this process writes."""

    run_dir: Path
    rank: int = 0
    writes_files: bool = True


class Callback:
    """The hook interface; every hook does nothing unless overridden. `self.run` is set before on_fit_start.

    After each optimizer step the loop calls, in this order: on_step_end, on_eval_end (when it evaluates), on_save
    (when it checkpoints). The checkpoint therefore includes what on_step_end did at that step: keep that in
    `state_dict()` and a resumed run continues bit for bit. See the module's docstring for `loop.completing`."""

    run: RunContext = RunContext(Path("."))

    def on_fit_start(self, loop) -> None:
        pass

    def on_step_end(self, loop) -> None:
        pass

    def on_eval_end(self, loop, metrics: dict[str, float]) -> None:
        pass

    def on_save(self, loop, path: Path | None) -> None:
        pass

    def on_fit_end(self, loop, final: dict[str, float]) -> None:
        pass

    def state_dict(self) -> dict:
        """What a resumed run needs to continue (saved in every checkpoint, per callback name)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Callbacks:
    """The run's callbacks by name, called in the order they were configured."""

    def __init__(self, callbacks: dict[str, Any] | None = None, run: RunContext | None = None):
        self.named = dict(callbacks or {})
        for callback in self.named.values():
            callback.run = run or RunContext(Path("."), writes_files=False)

    def on_fit_start(self, loop) -> None:
        for callback in self.named.values():
            callback.on_fit_start(loop)

    def on_step_end(self, loop) -> None:
        for callback in self.named.values():
            callback.on_step_end(loop)

    def on_eval_end(self, loop, metrics: dict[str, float]) -> None:
        for callback in self.named.values():
            callback.on_eval_end(loop, metrics)

    def on_save(self, loop, path: Path | None) -> None:
        for callback in self.named.values():
            callback.on_save(loop, path)

    def on_fit_end(self, loop, final: dict[str, float]) -> None:
        for callback in self.named.values():
            callback.on_fit_end(loop, final)

    def state_dict(self) -> dict:
        return {name: callback.state_dict() for name, callback in self.named.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, callback in self.named.items():
            if name in state:
                callback.load_state_dict(state[name])


HOOKS = ("on_fit_start", "on_step_end", "on_eval_end", "on_save", "on_fit_end")


def build_callbacks(nodes: dict[str, Any], run: RunContext | None = None) -> Callbacks:
    """Each `callbacks.<name>` node through runner.config.instantiate (the same allow-list and error messages as the model's)."""
    from runner.config.instantiate import instantiate
    from runner.errors import ConfigError

    built = {}
    for name, node in nodes.items():
        callback = instantiate(f"callbacks.{name}", node)
        if not all(callable(getattr(callback, hook, None)) for hook in HOOKS):
            missing = [hook for hook in HOOKS if not callable(getattr(callback, hook, None))]
            raise ConfigError(f"callbacks.{name}._target_", f"built a {type(callback).__name__}, which lacks "
                                                            f"{', '.join(missing)}; subclass runner.training.callbacks.Callback")
        built[name] = callback
    return Callbacks(built, run)


def _positive(name: str, value: Any, minimum: float = 1) -> None:
    if value < minimum:
        raise ValueError(f"{name} is {value}; it must be {minimum} or more")


class EarlyStopping(Callback):
    """Stop when the monitored metric has not improved by more than `min_delta` for `patience` evaluations in a
    row. `monitor` None: trainer.monitor, in trainer.monitor_mode. Stopping saves a checkpoint (the final one) and
    writes the reason to the log and to <run dir>/early_stopping.json (result.json's `stopped_early`)."""

    REASON_FILE = "early_stopping.json"

    def __init__(self, patience: int = 3, min_delta: float = 0.0, monitor: str | None = None,
                 mode: str | None = None):
        _positive("patience", patience)
        _positive("min_delta", min_delta, 0)
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode is {mode!r}; it must be min, max or null (trainer.monitor_mode)")
        self.patience, self.min_delta, self.monitor, self.mode = patience, min_delta, monitor, mode
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad_evaluations = 0

    def on_fit_start(self, loop) -> None:
        self.monitor = self.monitor or loop.settings.monitor
        self.mode = self.mode or getattr(loop.settings.monitor_mode, "value", loop.settings.monitor_mode)

    def on_eval_end(self, loop, metrics: dict[str, float]) -> None:
        if self.monitor not in metrics:
            return
        value = float(metrics[self.monitor])
        gain = (value - self.best if self.mode == "max" else self.best - value) if self.best is not None else None
        if gain is None or gain > self.min_delta:
            self.best, self.best_step, self.bad_evaluations = value, loop.state.step, 0
            return
        self.bad_evaluations += 1
        if self.bad_evaluations >= self.patience:
            # The value improvements are measured from (the last one by more than min_delta), not the run's best,
            # which a smaller gain since may have passed: "best" here contradicted the run's own summary.
            reason = (f"early stopping at step {loop.state.step}: {self.monitor} did not improve by more than "
                      f"{self.min_delta:g} on {self.best:.4f} (step {self.best_step}) for {self.patience} "
                      "evaluation(s)")
            if self.run.writes_files:
                (self.run.run_dir / self.REASON_FILE).write_text(json.dumps({
                    "reason": reason, "step": loop.state.step, "monitor": self.monitor, "best": self.best,
                    "best_step": self.best_step}) + "\n", encoding="utf-8")
            loop.request_stop(reason)

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_evaluations": self.bad_evaluations}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step, self.bad_evaluations = state["best"], state["best_step"], state["bad_evaluations"]


class EMA(Callback):
    """An exponential moving average of the weights, updated after every optimizer step with decay
    min(decay, (1 + n) / (10 + n)) at update n (so early averages are not dominated by the initial weights).
    Evaluated after each evaluation as val_ema/<metric>, and exported at the end to export/ema.safetensors."""

    def __init__(self, decay: float = 0.999, evaluate: bool = True, export: bool = True):
        if not 0 < decay < 1:
            raise ValueError(f"decay is {decay}; it must be between 0 and 1 (e.g. 0.999)")
        self.decay, self.evaluate, self.export = decay, evaluate, export
        self.shadow: list[torch.Tensor] | None = None
        self.updates = 0

    def _parameters(self, loop) -> list[torch.Tensor]:
        return [parameter for parameter in loop.accelerator.unwrap_model(loop.model).parameters()]

    def on_fit_start(self, loop) -> None:
        if getattr(loop.accelerator, "shards_parameters", False):
            # Each rank would average only its own shard, and the loop state that carries the average is written
            # by rank 0 alone: a resumed run would hand rank 0's shard to every rank.
            raise ConfigError("callbacks.ema", "is not supported with parallel=fsdp on several processes (each "
                                               "holds a shard of the weights); use parallel=ddp, or drop ema")
        if self.shadow is None:  # a resumed run has them from the checkpoint
            self.shadow = [parameter.detach().clone() for parameter in self._parameters(loop)]
        else:
            device = self._parameters(loop)[0].device
            self.shadow = [tensor.to(device) for tensor in self.shadow]

    @torch.no_grad()
    def on_step_end(self, loop) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for average, parameter in zip(self.shadow, self._parameters(loop)):
            average.lerp_(parameter.detach().to(average.dtype), 1 - decay)

    @contextmanager
    def averaged_weights(self, loop) -> Iterator[torch.nn.Module]:
        """The model with the averaged weights in place of its own, restored afterwards."""
        parameters = self._parameters(loop)
        saved = [parameter.detach().clone() for parameter in parameters]
        with torch.no_grad():
            for parameter, average in zip(parameters, self.shadow):
                parameter.copy_(average)
        try:
            yield loop.accelerator.unwrap_model(loop.model)
        finally:
            with torch.no_grad():
                for parameter, own in zip(parameters, saved):
                    parameter.copy_(own)

    def on_eval_end(self, loop, metrics: dict[str, float]) -> None:
        if not self.evaluate:
            return
        with self.averaged_weights(loop):
            averaged = loop.evaluate_metrics()
        loop.log({name.replace("val/", "val_ema/", 1): value for name, value in averaged.items()})

    def on_fit_end(self, loop, final: dict[str, float]) -> None:
        if not (self.export and self.run.writes_files):
            return
        from runner.checkpoint.contents import save_weights

        path = self.run.run_dir / EMA_EXPORT
        completing = getattr(loop, "completing", False)  # a loop of your own may lack it
        if completing and path.is_file():  # written whole (renamed into place) when the run ended
            return
        path.parent.mkdir(exist_ok=True)
        partial = path.with_name(f".partial-{path.name}")  # a full disk must not leave a file that looks complete
        try:
            with self.averaged_weights(loop) as model:
                save_weights(model, partial)
            partial.replace(path)
        except Exception as err:  # safetensors reports a failed write as its own error type, not OSError
            partial.unlink(missing_ok=True)
            raise write_error(err, path, "the EMA export") from err
        log.info("EMA weights exported: %s%s", path, " (it was missing)" if completing else "")

    def state_dict(self) -> dict:
        return {"shadow": [tensor.detach().cpu() for tensor in self.shadow or []], "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.shadow, self.updates = list(state["shadow"]) or None, state["updates"]


EMA_EXPORT = "export/ema.safetensors"


def end_artifacts(nodes: dict[str, Any]) -> list[str]:
    """The files (relative to the run dir) that the configured built-in callbacks write when the run ends."""
    # Recipes write the public name (runner.callbacks.EMA), which forwards to this module's.
    ema = {"runner.callbacks.EMA", f"{__name__}.EMA"}
    return [EMA_EXPORT for node in nodes.values() if node.get("_target_") in ema and node.get("export", True)]


class LearningRateMonitor(Callback):
    """Every param group's learning rate (train/lr_group<i>) and momentum (train/momentum_group<i>: momentum, or
    Adam's beta1), at the loop's log steps (trainer.log_every_steps)."""

    def on_step_end(self, loop) -> None:
        if loop.state.step % loop.settings.log_every_steps:
            return
        metrics = {}
        for index, group in enumerate(loop.optimizer.param_groups):
            metrics[f"train/lr_group{index}"] = float(group["lr"])
            momentum = group.get("momentum", group.get("betas", (None,))[0])
            if momentum is not None:
                metrics[f"train/momentum_group{index}"] = float(momentum)
        loop.log(metrics)


class ThroughputMonitor(Callback):
    """Mean wall time per optimizer step (perf/step_time_s), steps/s and samples/s over each logging window, and on
    CUDA the peak memory allocated (perf/max_memory_mb). On a GPU the window's clock stops when the loss is read at
    the log step, so the mean is right even though single steps run asynchronously."""

    def on_fit_start(self, loop) -> None:
        self._window_start, self._window_steps = time.perf_counter(), 0

    def on_step_end(self, loop) -> None:
        self._window_steps += 1
        if loop.state.step % loop.settings.log_every_steps:
            return
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        samples = self._window_steps * loop.accumulation * loop.samples_per_micro_batch
        metrics = {"perf/step_time_s": elapsed / self._window_steps, "perf/steps_per_s": self._window_steps / elapsed,
                   "perf/samples_per_s": samples / elapsed}
        if loop.accelerator.device.type == "cuda":
            metrics["perf/max_memory_mb"] = torch.cuda.max_memory_allocated(loop.accelerator.device) / 2**20
        loop.log(metrics)
        self._window_start, self._window_steps = time.perf_counter(), 0


class Profiler(Callback):
    """torch.profiler over a window of optimizer steps on the main process: skip `wait` steps, warm up for
    `warmup`, record `active`. The trace goes to <run dir>/profiler/ (Chrome trace JSON: open it in
    chrome://tracing or Perfetto, or with TensorBoard's profiler plugin)."""

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False):
        _positive("wait", wait, 0)
        _positive("warmup", warmup, 0)
        _positive("active", active)
        self.window = dict(wait=wait, warmup=warmup, active=active)
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self._profiler = None

    def on_fit_start(self, loop) -> None:
        # Completing a finished run (loop.completing) trains no step to profile.
        if not self.run.writes_files or getattr(loop, "completing", False):
            return
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU]
        if loop.accelerator.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        trace_dir = self.run.run_dir / "profiler"
        write_trace = tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{self.run.rank}")
        self._profiler = profile(activities=activities, schedule=schedule(**self.window, repeat=1),
                                 on_trace_ready=write_trace, **self.options)
        self._profiler.start()
        log.info("profiling steps %d to %d into %s", loop.state.step + self.window["wait"] + self.window["warmup"] + 1,
                 loop.state.step + sum(self.window.values()), trace_dir)

    def on_step_end(self, loop) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def on_fit_end(self, loop, final: dict[str, float]) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
