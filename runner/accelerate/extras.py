"""The parts of Accelerate's Accelerator API that sit beside the training step: which process runs a function,
sharing inputs out, a stop flag all processes agree on, extra objects to checkpoint, freeing memory, the
experiment trackers (runner/accelerate/trackers.py), save_model (runner/checkpoint/model_dir.py) and save_state/load_state
(runner/accelerate/saved_state.py). Mixed into runner.Accelerator, whose process counts they read.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.accelerate import collectives, trackers
from runner.distributed import dist as distributed
from runner.config import ParallelKind

_log = logging.getLogger(__name__)


class AcceleratorExtras:
    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """This process's share of `inputs` (list, tuple, tensor, dict of them, a dataset), as even as possible."""
        yield collectives.split(inputs, self.num_processes, self.process_index, apply_padding)

    @contextmanager
    def join_uneven_inputs(self, joinables: list, even_batches: bool | None = None):
        """Let processes that run out of batches first wait for the others (torch's Join over DDP models and
        optimizers such as ZeroRedundancyOptimizer), and, with `even_batches`, set how the prepared loaders end
        for the duration (False: uneven ends, which this context makes safe). A no-op on one process."""
        loaders = [loader.batch_shard for loader in self.prepared_loaders if loader.batch_shard is not None]
        kept = [loader.even_batches for loader in loaders]
        if even_batches is not None:
            if len(loaders) < len(self.prepared_loaders):  # Accelerate's warning, word for word
                warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some "
                              "dataloaders given were iterable")
            for loader in loaders:
                loader.even_batches = even_batches
        try:
            if self.num_processes == 1:
                yield
                return
            from torch.distributed.algorithms.join import Join

            with Join(list(joinables)):
                yield
        finally:
            for loader, even in zip(loaders, kept):
                loader.even_batches = even

    @property
    def prepared_loaders(self) -> list:
        """The DataLoaders this Accelerator prepared (runner/accelerate/dataloader.py's PreparedDataLoader)."""
        if "_prepared_loaders" not in self.__dict__:
            self._prepared_loaders: list = []
        return self._prepared_loaders

    # Accelerate's one-kind-at-a-time names for prepare()
    def prepare_model(self, model: nn.Module) -> nn.Module:
        return self._prepare_one(_expect(model, nn.Module, "prepare_model"))

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer):
        return self._prepare_one(_expect(optimizer, torch.optim.Optimizer, "prepare_optimizer"))

    def prepare_scheduler(self, scheduler):
        return self._prepare_one(_expect(scheduler, torch.optim.lr_scheduler.LRScheduler, "prepare_scheduler"))

    def prepare_data_loader(self, loader: torch.utils.data.DataLoader):
        return self._prepare_one(_expect(loader, torch.utils.data.DataLoader, "prepare_data_loader"))

    @contextmanager
    def local_main_process_first(self):
        """Each machine's local main process runs the block first, then that machine's others."""
        with distributed.local_main_first(self.dist):
            yield

    def set_trigger(self) -> None:
        """Raise this process's flag; check_trigger() then tells every process (e.g. to stop early)."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """Whether any process raised its flag since the last check (a collective: call it on every process);
        clears the flags."""
        self._collective()
        raised = distributed.all_reduce(torch.tensor(float(self._trigger), device=self.device), "max")
        self._trigger = False
        return bool(raised.item() > 0)

    # -- which process runs it --------------------------------------------------------------------------------------

    def on_main_process(self, function):
        """Decorator: the function runs on the main process only (returns None elsewhere)."""
        return _run_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function):
        """Decorator: the function runs on each machine's local main process only."""
        return _run_if(function, lambda: self.is_local_main_process)

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    def save(self, obj: Any, f) -> None:
        """torch.save(obj, f) on the main process only (Accelerate's accelerator.save)."""
        if self.is_main_process:
            torch.save(obj, f)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The whole model's weights as one plain state dict on the CPU (Accelerate's get_state_dict). Under FSDP
        every process must call it: the shards are gathered onto the main process, and the others get {}."""
        from runner.checkpoint.sharded import full_weights

        model = self.unwrap_model(model, keep_torch_compile=False) if unwrap else model
        return full_weights(model, distributed=self.shards_parameters)

    def save_model(self, model: nn.Module, save_directory: str | Path, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """The model's weights into `save_directory` as transformers' from_pretrained reads them: model.safetensors,
        or shards of at most `max_shard_size` ("5GB", "500MB" or bytes) with model.safetensors.index.json
        (runner/checkpoint/model_dir.py). Every process calls it; the main process writes, replacing an earlier
        save only once the new files are complete."""
        if not safe_serialization:
            from runner.errors import ConfigError, Problem

            raise ConfigError(Problem("save_model(safe_serialization)", (
                "is False; the runner writes safetensors only (a pickled pytorch_model.bin runs code when it is "
                "loaded); leave it True")))
        from runner.checkpoint.model_dir import plan_shards, save_weights

        weights = self.get_state_dict(model)
        split = plan_shards(weights, max_shard_size)
        if self.is_main_process:
            save_weights(weights, split, Path(save_directory))
        self.wait_for_everyone()  # no process reads the directory before it is complete

    def on_last_process(self, function):
        return _run_if(function, lambda: self.process_index == self.num_processes - 1)

    def on_process(self, function=None, process_index: int | None = None):
        """Decorator: the function runs on process `process_index` only (`@accelerator.on_process(process_index=1)`)."""
        if function is None:
            return lambda inner: self.on_process(inner, process_index)
        return _run_if(function, lambda: self.process_index == process_index)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Objects with state_dict()/load_state_dict() to keep with the prepared ones (self.custom_objects). Others
        raise ValueError naming each by its index, as Accelerate's does."""
        bad = [f"Item at index {index} ({type(obj).__name__})" for index, obj in enumerate(objects)
               if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))]
        if bad:
            verb = "has" if len(bad) == 1 else "have"
            raise ValueError(f"register_for_checkpointing(): {', '.join(bad)} {verb} no state_dict() and "
                             "load_state_dict(); register objects that have both (models, optimizers, schedulers, "
                             "or your own class with the two methods)")
        self.custom_objects.extend(objects)

    @property
    def custom_objects(self) -> list:
        if "_custom_objects" not in self.__dict__:
            self._custom_objects: list = []
        return self._custom_objects

    def free_memory(self, *objects: Any) -> list:
        """Forget every prepared object (and the given references), collect garbage, empty the CUDA cache;
        returns a None per object given (`model, optimizer = accelerator.free_memory(model, optimizer)`)."""
        import gc

        for held in (self._models, self._optimizers, self._schedulers, self.custom_objects, self.shared.loaders,
                     self.prepared_loaders):
            held.clear()
        released = [None] * len(objects)
        del objects
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return released

    clear = free_memory

    # -- trackers (runner/accelerate/trackers.py) ------------------------------------------------------------------------------

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None):
        """Start the `log_with` trackers for a run named `project_name` under project_dir: on the main process, and
        a tracker object of your own whose `main_process_only` is False on every process (as Accelerate does)."""
        wanted = [tracker for tracker in self.log_with if self.is_main_process
                  or not getattr(tracker, "main_process_only", True)]
        self.trackers = trackers.start(wanted, project_name, self.project_dir, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False):
        for tracker in self.trackers:
            if getattr(tracker, "name", None) == name:
                return tracker.tracker if unwrap else tracker
        return None

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(getattr(tracker, "name", None), {}))

    def end_training(self) -> None:
        for tracker in self.trackers:
            if callable(getattr(tracker, "finish", None)):
                tracker.finish()
        self.trackers = []

    def register_save_state_pre_hook(self, hook) -> torch.utils.hooks.RemovableHandle:
        """`hook(models, weights, output_dir)` runs at the start of every save_state, as in Accelerate: `models` the
        prepared models, `weights` their state dicts. A model whose entry the hook removes from `weights` is left
        out of the save (the hook saves it its own way); other changes to `weights` are not saved."""
        return _register(self, "_save_state_pre_hooks", hook)

    def register_load_state_pre_hook(self, hook) -> torch.utils.hooks.RemovableHandle:
        """`hook(models, input_dir)` runs at the start of every load_state; a model the hook removes from `models`
        is not loaded (the hook loads it its own way), as in Accelerate."""
        return _register(self, "_load_state_pre_hooks", hook)

    def save_state(self, output_dir: str | Path | None = None, safe_serialization: bool = True,
                   **save_model_func_kwargs) -> Path:
        """Save every prepared model, optimizer and scheduler, the scaler, the objects registered for checkpointing
        and each process's RNG state, in the runner's checkpoint format (written whole or not at all, with a
        verified manifest; sharded under FSDP). No directory: the next automatically named one under the
        project_config's project_dir (runner/accelerate/options.py: ProjectConfiguration).

        The weights are written as safetensors whatever `safe_serialization` says: Accelerate's False pickles them
        (a file that can run code when loaded), which this format never does; False is accepted and says so once.
        `save_model_func_kwargs` are Accelerate's arguments for its own model writer and are refused if given."""
        from runner.accelerate import saved_state  # safetensors and DCP: only for a loop that saves

        if save_model_func_kwargs:
            raise TypeError(f"save_state() got {sorted(save_model_func_kwargs)}: runner.Accelerator writes the weights "
                            "itself (safetensors, sharded under FSDP) and takes no arguments for a model writer")
        if not safe_serialization and not getattr(self, "_said_safe_serialization", False):
            self._said_safe_serialization = True
            _log.info("save_state(safe_serialization=False): the weights are written as safetensors anyway (a "
                      "pickled file could run code when loaded); load_state reads them back the same way")
        project = self.project_configuration
        automatic = output_dir is None
        if automatic:
            output_dir = saved_state.automatic_dir(project, "save_state")
        objects = self._state_objects()
        hooks = list(getattr(self, "_save_state_pre_hooks", {}).values())
        if hooks:
            weights = [model.state_dict() for model in objects.models]
            kept = list(weights)
            for hook in hooks:
                hook(list(self._models), kept, str(output_dir))
            objects.models = [model for model, state in zip(objects.models, weights)
                              if any(state is still for still in kept)]
        saved = saved_state.save(Path(output_dir), objects, self.dist.world_size, self.is_main_process)
        if automatic:
            project.iteration += 1
            if project.total_limit and self.is_main_process:
                saved_state.keep_newest(saved.parent, project.total_limit)
        return saved

    def load_state(self, input_dir: str | Path | None = None, load_kwargs: dict | None = None,
                   **load_model_func_kwargs) -> None:
        """Restore what save_state wrote into the objects prepared (in the same order) by this Accelerator. A
        sharded state may be loaded on another number of processes. No directory: the newest automatically named
        one under the project_config's project_dir. A directory Accelerate's own save_state wrote is read too, as
        plain data (runner/accelerate/accelerate_dir.py). `load_kwargs` and `load_model_func_kwargs` are Accelerate's
        arguments for torch.load and its model reader: refused if given (the state is read with weights_only).
        `map_location` (None, "cpu" or "on_device", as in Accelerate) is accepted and changes nothing: the state is
        read to the CPU and each optimizer's load_state_dict moves it to its parameters' device, which is where
        Accelerate's optimizer state ends up too."""
        from runner.accelerate import saved_state

        map_location = load_model_func_kwargs.pop("map_location", None)
        if map_location not in (None, "cpu", "on_device"):
            raise TypeError(f"Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or "
                            f"`'on_device'`. Got `{map_location}`.")
        if load_kwargs or load_model_func_kwargs:
            raise TypeError(f"load_state() got {sorted({**(load_kwargs or {}), **load_model_func_kwargs})}: "
                            "runner.Accelerator reads the state itself (safetensors, and torch.load with "
                            "weights_only=True, so that nothing in it runs) and takes no reader arguments")
        automatic = input_dir is None
        if automatic:
            input_dir = saved_state.newest_dir(self.project_configuration)
        objects = self._state_objects()
        hooks = list(getattr(self, "_load_state_pre_hooks", {}).values())
        if hooks:
            models = list(self._models)
            for hook in hooks:
                hook(models, str(input_dir))
            objects.models = [unwrapped for model, unwrapped in zip(self._models, objects.models)
                              if any(model is still for still in models)]
        saved_state.load(Path(input_dir), objects, self.dist.rank, self.dist.world_size)
        if automatic:  # the next save_state() continues the numbering, as Accelerate's does
            self.project_configuration.iteration = saved_state.number_of(Path(input_dir)) + 1

    def _state_objects(self):
        from runner.accelerate import saved_state

        models = [self.unwrap_model(model, keep_torch_compile=False) for model in self._models]
        return saved_state.Objects(models, self._optimizers, self._schedulers, self.scaler,
                                   self.parallel.kind is ParallelKind.fsdp, list(self.custom_objects))


def _register(accelerator, registry: str, hook) -> torch.utils.hooks.RemovableHandle:
    if registry not in accelerator.__dict__:
        setattr(accelerator, registry, OrderedDict())  # RemovableHandle keeps a weak reference: not a plain dict
    hooks = getattr(accelerator, registry)
    handle = torch.utils.hooks.RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def _run_if(function, condition):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs) if condition() else None

    return wrapper


def _expect(obj: Any, kind: type, method: str) -> Any:
    if not isinstance(obj, kind):
        name = {nn.Module: "torch.nn.Module", torch.optim.Optimizer: "torch.optim.Optimizer",
                torch.utils.data.DataLoader: "torch.utils.data.DataLoader"}.get(kind, "torch LR scheduler")
        raise TypeError(f"Accelerator.{method}() takes a {name}, not a {type(obj).__name__}; "
                        "accelerator.prepare() takes any of them")
    return obj
