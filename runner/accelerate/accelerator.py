"""The Accelerator: device placement, DDP, autocast, gradient scaling, accumulation and collectives, in any loop.

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for source, targets in loader:
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss = F.cross_entropy(model(source), targets)
            accelerator.backward(loss)
            optimizer.step()        # a no-op until the 4th micro-batch
            scheduler.step()
            optimizer.zero_grad()

In fp32 without accumulation on one CPU process `prepare` hands back the very objects it was given, so the hot path
costs nothing. Wrappers (runner/accelerate/prepared.py) appear only where the plain object would do the wrong thing.
"""

from __future__ import annotations

import builtins
import os
import random
import weakref
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.distributed import dist as distributed
from runner.accelerate import parallel
from runner.config import ParallelConfig, ParallelKind, PrecisionKind
from runner.distributed.devices import Hardware, for_device, this_process
from runner.accelerate.parallel import chosen_settings, follow_replaced_parameters
from runner.distributed.dist import DistInfo
from runner.errors import ConfigError, Problem
from runner.accelerate.precision import Precision, autocast_forward, plain_forward
from runner.accelerate import collectives
from runner.accelerate.extras import AcceleratorExtras
from runner.accelerate.dataloader import PreparedDataLoader, warn_of_fork_deadlock
from runner.accelerate.dispatch import DispatchedDataLoader
from runner.accelerate.trackers import kinds as tracker_kinds
from runner.accelerate.options import (
    DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin, ProjectConfiguration, accumulation_steps,
    as_own, distributed_type, make_scaler, split_handlers,
)
from runner.accelerate.prepared import AcceleratedOptimizer, AcceleratedScheduler, BatchSource, DeviceBatches, SharedState, tree_map

ACCELERATE_PRECISION = {"no": "fp32", None: "fp32"}  # Accelerate's mixed_precision names that differ from ours
_NO_SYNC = nullcontext()


def precision_kind(precision: str | None, mixed_precision: str | None) -> str:
    """The runner's precision name from either way of giving it (Accelerate's mixed_precision, or precision), each
    checked: given both, they must agree."""
    valid = [*(kind.value for kind in PrecisionKind), *(name for name in ACCELERATE_PRECISION if name)]
    for name, value in (("precision", precision), ("mixed_precision", mixed_precision)):
        if value is not None and value not in valid:
            raise ConfigError(Problem(f"Accelerator({name})", f"is {value!r}; choose one of {', '.join(valid)}"))
    kinds = {name: ACCELERATE_PRECISION.get(value, value) for name, value in
             (("precision", precision), ("mixed_precision", mixed_precision)) if value is not None}
    if len(set(kinds.values())) > 1:
        raise ConfigError(Problem("Accelerator(precision)", (
            f"is {precision!r} and mixed_precision is {mixed_precision!r}: give the precision once")))
    return next(iter(kinds.values()), "fp32")


class Accelerator(AcceleratorExtras):
    def __init__(
        self,
        device: str | torch.device | None = None,
        precision: str | None = None,
        dist: DistInfo | None = None,
        grad_accum_steps: int = 1,
        *,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        hardware: Hardware | None = None,
        parallel: ParallelConfig | ParallelKind | str | None = None,
        kwargs_handlers: list | None = None,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        gradient_accumulation_plugin=None,
        step_scheduler_with_optimizer: bool = True,
        project_dir: str | Path | None = None,
        log_with: str | list | None = None,
        project_config: ProjectConfiguration | None = None,
        split_batches: bool | None = None,
        autocast_forward: bool = True,
    ):
        """`precision`/`mixed_precision`: fp32 (Accelerate's "no"), bf16, fp16, fp8. The device: `hardware` (what
        the runner resolved), else `device` ("cpu", "cuda", "xla" for a TPU through torch_xla), else this process's
        GPU when CUDA is present (`cpu=True`: the CPU). `parallel`: "ddp" (the default), "fsdp", "none", or a
        ParallelConfig with their settings (a DistributedDataParallelKwargs in `kwargs_handlers`: DDP's).
        Neither given: ACCELERATE_MIXED_PRECISION from the environment (`runner launch` sets it from the config, as
        `accelerate launch` does), else fp32.
        `mixed_precision`, `gradient_accumulation_steps`, `cpu` and `kwargs_handlers` are Accelerate's names, as
        are `dataloader_config`, `gradient_accumulation_plugin`, `step_scheduler_with_optimizer`, `project_dir` and
        `log_with`, `project_config` (runner/accelerate/options.py, runner/accelerate/trackers.py); Accelerate's
        own objects for these are read as the runner's, refusing what the runner does not support. `split_batches`:
        Accelerate's older spelling of DataLoaderConfiguration(split_batches=...).

        `autocast_forward`: under bf16 or fp16, prepare() makes a model's forward run under the precision's autocast
        and return its floating outputs in fp32, as Accelerate's prepare does, so a script that never enters
        accelerator.autocast() still trains in its precision. The runner's own loop autocasts explicitly and
        computes its loss from the low-precision outputs (an fp32 copy of a large vocabulary's logits costs memory),
        so it passes False."""
        self.dist = dist or DistInfo.from_env()
        if hardware is None:
            hardware = for_device("cpu" if cpu else device) if (cpu or device is not None) else this_process()
        self.hardware = hardware
        # Started by torchrun, srun or runner.launch: join the group here (Accelerate's Accelerator() does too);
        # a group the script (or the runner's worker) already made is kept.
        distributed.join_group(hardware.backend)
        self.xla = None
        if hardware.device_type == "xla":
            from runner.accelerate.xla import Xla

            self.xla = Xla()
        explicit = device is not None and self.xla is None  # an XLA device is torch_xla's to hand out
        self.device = torch.device(device) if explicit else hardware.device(self.dist.local_rank, self.xla)
        if precision is None and mixed_precision is None:
            # Set by `runner launch` (from the machine's config or its command line) and by `accelerate launch`.
            mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION") or None
        kind = precision_kind(precision, mixed_precision)
        self.precision = Precision(kind, self.device.type)
        ddp_settings, scaler_settings = split_handlers(kwargs_handlers)
        self.scaler = make_scaler(self.precision.make_scaler(), self.device.type, scaler_settings)
        self.gradient_accumulation_steps, self.gradient_accumulation_plugin = accumulation_steps(
            gradient_accumulation_steps, grad_accum_steps,
            as_own(gradient_accumulation_plugin, GradientAccumulationPlugin, "gradient_accumulation_plugin"))
        self.parallel = chosen_settings(parallel, ddp_settings)
        self.dataloader_config = as_own(dataloader_config, DataLoaderConfiguration, "dataloader_config") or \
            DataLoaderConfiguration()
        if split_batches is not None:
            if dataloader_config is not None and self.dataloader_config.split_batches != split_batches:
                raise ConfigError(Problem("Accelerator(split_batches)", (
                    f"is {split_batches} and dataloader_config.split_batches is "
                    f"{self.dataloader_config.split_batches}; give it once, in DataLoaderConfiguration")))
            self.dataloader_config = replace(self.dataloader_config, split_batches=split_batches)
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.autocast_forward = autocast_forward
        self.project_configuration = as_own(project_config, ProjectConfiguration, "project_config") or \
            ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.project_dir = str(project_dir)
        configured = self.project_configuration.project_dir
        self.project_dir = None if configured is None else Path(configured)
        self.log_with = tracker_kinds(log_with)
        self.trackers: list = []
        self._trigger = False
        self.shared = SharedState()
        self._micro_steps = 0
        self._models: list[nn.Module] = []
        self._optimizers: list = []
        self._schedulers: list = []
        # FSDP puts new (DTensor) parameters in place of the model's: an optimizer built on the old ones is
        # pointed at the new ones when it is prepared (old parameter's id -> (weak reference to it, new)). Weak:
        # holding the old, whole parameters would keep the unsharded model alive on every process (measured with
        # benchmarks/fsdp_memory.py); a dead reference means its id may belong to another tensor now.
        self._replaced_parameters: dict[int, tuple[weakref.ref, nn.Parameter]] = {}

    # -- who am I -------------------------------------------------------------------------------------------------

    @property
    def is_main_process(self) -> bool:
        return self.dist.is_main

    @property
    def is_local_main_process(self) -> bool:
        return self.dist.is_local_main

    @property
    def process_index(self) -> int:
        return self.dist.rank

    @property
    def local_process_index(self) -> int:
        return self.dist.local_rank

    @property
    def num_processes(self) -> int:
        return self.dist.world_size

    @property
    def mixed_precision(self) -> str:
        """Accelerate's value: "no" for fp32 (scripts branch on `!= "no"`, e.g. to pad batches for fp16/bf16), else
        the precision's name."""
        kind = self.precision.kind.value
        return "no" if kind == "fp32" else kind

    @property
    def distributed_type(self) -> DistributedType:
        return distributed_type(self.device.type, self.num_processes, getattr(self.parallel.kind, "value", "ddp"))

    @property
    def state(self) -> "Accelerator":
        """Accelerate's AcceleratorState: here the Accelerator itself answers the same questions (device,
        distributed_type, num_processes, process_index, mixed_precision...); there is no global state."""
        return self

    @property
    def gradient_state(self) -> SharedState:
        """sync_gradients, end_of_dataloader, in_dataloader, active_dataloader, as Accelerate's GradientState."""
        return self.shared

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @property
    def shards_parameters(self) -> bool:
        """Whether prepared models are sharded across the processes (FSDP), so every forward is a collective."""
        return parallel.shards(self.parallel, self.dist.is_distributed)

    @property
    def sync_gradients(self) -> bool:
        """True on the micro-step that ends an accumulation cycle (always, without accumulation)."""
        return self.shared.sync_gradients

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 found inf/nan gradients)."""
        return any(getattr(optimizer, "step_was_skipped", False) for optimizer in self._optimizers)

    def describe(self) -> str:
        """The startup line: device, autocast dtype, scaler, fp8 modules, processes, accumulation."""
        return (f"device {self.device} | {self.precision.describe()} | {self.num_processes} process(es)"
                f" | grad accumulation {self.gradient_accumulation_steps}")

    def print(self, *args, **kwargs) -> None:
        """print() on the main process only."""
        if self.is_main_process:
            builtins.print(*args, **kwargs)

    # -- prepare --------------------------------------------------------------------------------------------------

    def prepare(self, *objects: Any) -> Any:
        """Ready models, optimizers, data loaders / batch sources and LR schedulers for this device, in any order;
        returned in the order given. Models are prepared first, so an optimizer follows a sharded model's new
        parameters whatever the order."""
        order = sorted(range(len(objects)), key=lambda index: not isinstance(objects[index], nn.Module))
        prepared: list[Any] = [None] * len(objects)
        for index in order:
            prepared[index] = self._prepare_one(objects[index])
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, nn.Module):
            return self._prepare_model(obj)
        if isinstance(obj, torch.optim.Optimizer):
            return self._prepare_optimizer(obj)
        if isinstance(obj, BatchSource):
            return self._on_device(obj.shard(self.dist.rank, self.dist.world_size))
        if isinstance(obj, torch.utils.data.DataLoader):
            return self._prepare_dataloader(obj)
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            return self._prepare_scheduler(obj)
        # Anything else (None, a list, a tokenizer) comes back as given, as from Accelerate's prepare: scripts pass
        # such objects through it.
        return obj

    def convert_precision(self, model: nn.Module) -> nn.Module:
        """fp8: swap eligible Linear layers for Float8Linear (in place). Call before building the optimizer."""
        return self.precision.convert(model)

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        model = self.convert_precision(model)
        self._models.append(model)
        # An optimizer built on the model's parameters must follow them where preparing replaces them: FSDP shards
        # them, and moving a model to an XLA device makes new parameter objects (torch cannot swap an XLA tensor
        # into a CPU parameter in place). Accelerate remaps the optimizer for both, as here.
        before = dict(model.named_parameters(remove_duplicate=False))
        if self.autocast_forward and self.precision.autocast_dtype is not None:
            autocast_forward(model, self.precision.autocast)  # the user's module, so unwrap_model keeps it
        if not self.shards_parameters:
            model = parallel.wrap(model.to(self.device), self.parallel, self.device, self.dist.is_distributed)
        else:
            # Not moved first: FSDP moves each unit's shard to the device as it shards it, so the whole model is
            # never on one device.
            model = parallel.wrap(model, self.parallel, self.device, True, world_size=self.dist.world_size,
                                  precision=self.precision.kind)
        after = dict(self.unwrap_model(model, keep_torch_compile=False).named_parameters(remove_duplicate=False))
        self._replaced_parameters.update({id(old): (weakref.ref(old), after[name]) for name, old in before.items()
                                         if after.get(name) is not None and after[name] is not old})
        del before
        return model

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer):
        if self._replaced_parameters:
            follow_replaced_parameters(optimizer, self._replaced_parameters)
        if self.scaler is not None or self.xla is not None or self.gradient_accumulation_steps > 1:
            optimizer = AcceleratedOptimizer(optimizer, self.shared, self.scaler, self.xla)
        self._optimizers.append(optimizer)
        return optimizer

    def _prepare_dataloader(self, loader: torch.utils.data.DataLoader):
        """This process's share of the loader's batches (runner/accelerate/dataloader.py). Also on one CPU process,
        as Accelerate's DataLoaderShard: gradient_state (active_dataloader, end_of_dataloader) follows it, the
        batches and the global RNG's draws stay the plain loader's."""
        prepared = self._sharing(loader, torch.device("cpu") if self.xla is not None else self.device)
        self.prepared_loaders.append(prepared)
        return self.xla.loader(prepared, self.device) if self.xla is not None else prepared

    def _prepare_scheduler(self, scheduler):
        # Accelerate's convention, followed by default: N processes each drawing a whole batch take N times the
        # samples of one step, so a schedule written for one process steps N times per optimizer step (once
        # with split_batches: a step then covers the batch one process had). step_scheduler_with_optimizer=False:
        # the schedule is the user's to step, on every call. The runner's own loop splits its global batch
        # (runner/launch/worker.py passes split_batches=True), so it steps once.
        steps = 1 if self.split_batches else self.num_processes
        if self.step_scheduler_with_optimizer and (self.scaler is not None or self.gradient_accumulation_steps > 1
                                                   or steps > 1):
            scheduler = AcceleratedScheduler(scheduler, self.shared, self._optimizers, steps)
        self._schedulers.append(scheduler)
        return scheduler

    def skip_first_batches(self, dataloader, num_batches: int = 0):
        """A loader that passes over this process's first `num_batches` batches (to resume mid-epoch); use the
        original loader for the epochs after."""
        if not isinstance(dataloader, PreparedDataLoader):
            dataloader = self._sharing(dataloader, self.device)
        return dataloader.skipping(num_batches)

    def _sharing(self, loader: torch.utils.data.DataLoader, device: torch.device) -> PreparedDataLoader:
        """The loader re-made around this process's share: read on every process, or with dispatch_batches=True
        read on the main process and sent (runner/accelerate/dispatch.py)."""
        if self.dataloader_config.dispatch_batches and self.xla is not None:
            raise ConfigError(Problem("DataLoaderConfiguration.dispatch_batches", (
                "True is not supported on XLA devices (nor is it in Accelerate): each process reads its share; use "
                "dispatch_batches=False")))
        if self.is_main_process:
            warn_of_fork_deadlock(loader, self.num_processes)
        kind = DispatchedDataLoader if self.dataloader_config.dispatch_batches else PreparedDataLoader
        return kind(loader, self.num_processes, self.process_index, self.dataloader_config, self.shared, device)

    def _on_device(self, batches):
        if self.xla is not None:
            return self.xla.loader(batches, self.device)
        return batches if self.device.type == "cpu" else DeviceBatches(batches, self.device)

    # -- the step -------------------------------------------------------------------------------------------------

    def autocast(self):
        """The precision's autocast context (a no-op in fp32). Use it for evaluation too."""
        return self.precision.autocast()

    def accumulate(self, *models: nn.Module):
        """Context for one micro-batch: counts it, and on all but the last of a cycle skips DDP's gradient
        all-reduce (no_sync), while prepared optimizers and schedulers hold their step until the cycle ends. The
        last batch of a prepared DataLoader ends the cycle (sync_with_dataloader); sync_each_batch all-reduces
        every micro-batch and still steps once per cycle."""
        if self.gradient_accumulation_steps == 1:  # every micro-batch ends its cycle: nothing to count or skip
            self.shared.sync_gradients = True
            return _NO_SYNC
        plugin = self.gradient_accumulation_plugin
        if plugin.sync_with_dataloader and self.shared.end_of_dataloader:
            self._micro_steps = 0
            self.shared.sync_gradients = True
        else:
            self._micro_steps += 1
            self.shared.sync_gradients = self._micro_steps % self.gradient_accumulation_steps == 0
        # FSDP reduce-scatters every micro-batch's gradients into the shards, where they add up: skipping that
        # (set_requires_gradient_sync) would keep the whole model's gradients on every process, the memory
        # FSDP is chosen to save.
        if self.shared.sync_gradients or plugin.sync_each_batch or self.shards_parameters:
            return _NO_SYNC
        return self.no_sync(*models)

    def no_sync(self, *models: nn.Module):
        """Context in which DDP models keep their gradients local (no all-reduce); a no-op for other models."""
        stack = ExitStack()
        for model in models:
            if isinstance(model, nn.parallel.DistributedDataParallel):
                stack.enter_context(model.no_sync())
        return stack

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """loss.backward(), divided over the accumulation cycle and scaled under fp16."""
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self.scaler is None:
            loss.backward(**kwargs)
        else:
            self.scaler.scale(loss).backward(**kwargs)

    def unscale_gradients(self) -> None:
        """Under fp16, divide the gradients by the loss scale now (clip_grad_norm_ does it for you)."""
        for optimizer in self._optimizers:
            if isinstance(optimizer, AcceleratedOptimizer):
                optimizer.unscale_gradients()

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the global gradient norm; under fp16 the gradients are unscaled first so the norm is real."""
        self.unscale_gradients()
        norm = nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        # FSDP's gradients are DTensor shards: their norm is a (replicated) DTensor; callers get a plain tensor.
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def clip_grad_value_(self, parameters, clip_value: float) -> None:
        self.unscale_gradients()
        nn.utils.clip_grad_value_(parameters, clip_value)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> nn.Module:
        """The user's module without the DDP wrapper prepare() put around it, as Accelerate's: a torch.compile
        wrapper of the user's is kept unless `keep_torch_compile=False`, and the autocast forward prepare() set
        (autocast_forward) unless `keep_fp32_wrapper=False`."""
        while True:
            if isinstance(model, nn.parallel.DistributedDataParallel):
                model = model.module
            elif hasattr(model, "_orig_mod") and not (keep_torch_compile and not isinstance(
                    model._orig_mod, nn.parallel.DistributedDataParallel)):
                model = model._orig_mod
            else:
                break
        if not keep_fp32_wrapper:
            plain_forward(model)
        return model

    def destroy_process_group(self, group=None) -> None:
        """Accelerate's state.destroy_process_group(): leave the process group, if there is one (the whole group:
        the runner's own, which drains gloo's threads before the script goes on to exit)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        if group is None:
            distributed.destroy_process_group()
        else:
            torch.distributed.destroy_process_group(group)

    @contextmanager
    def trigger_sync_in_backward(self, model: nn.Module):
        """Make the next backward all-reduce the gradients even inside no_sync()/accumulate(), as Accelerate's does
        (DDP's own switches; a no-op for a model that is not DDP-wrapped)."""
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            yield
            return
        kept = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = kept

    # -- across processes -----------------------------------------------------------------------------------------

    def _collective(self) -> None:
        distributed.require_group(self.num_processes)

    def gather(self, tensors: Any) -> Any:
        """Every process's tensors concatenated along dim 0, in rank order (0-d tensors become 1 element each)."""
        self._collective()
        return tree_map(distributed.all_gather_cat, tensors)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather` (of tensors; other objects are gathered as objects, lists flattened), minus the samples that
        were repeated to complete the last global batch of a prepared DataLoader."""
        self._collective()
        return collectives.gather_for_metrics(input_data, self.shared.real_samples, use_gather_object)

    def reduce(self, tensors: Any, reduction: str = "sum") -> Any:
        """A copy of the tensors reduced over all processes: "sum", "mean", "max" or "min"."""
        self._collective()
        return tree_map(lambda tensor: distributed.all_reduce(tensor.clone(), reduction), tensors)

    def pad_across_processes(self, tensors: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        """Each tensor padded (with `pad_index`, at the end or `pad_first`) along `dim` to the largest size any
        process has there, so they can be gathered."""
        self._collective()
        return collectives.pad(tensors, dim, pad_index, pad_first)

    def forwards_to_match(self, count: int) -> int:
        """How many forwards this process must add to its `count` so that every process runs as many: under FSDP
        each forward gathers parameters from all of them, so an evaluation shard shorter than another's would
        leave its peers waiting. 0 when forwards are not collective."""
        if not self.shards_parameters:
            return 0
        most = distributed.all_reduce(torch.tensor(count, device=self.device), "max")
        return int(most.item()) - count

    def wait_for_everyone(self) -> None:
        self._collective()
        distributed.barrier()

    @contextmanager
    def main_process_first(self):
        """The main process runs the block first (e.g. to download or cache data), then the others."""
        if not self.is_main_process:
            distributed.barrier()
        yield
        if self.is_main_process:
            distributed.barrier()

    def set_seed(self, seed: int, device_specific: bool = False) -> None:
        set_seed(seed + self.process_index if device_specific else seed)


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (every CUDA device too) for a reproducible run."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

