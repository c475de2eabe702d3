"""What `Accelerator.prepare(DataLoader)` hands back: the user's loader re-made around this process's share of its
batches (runner/accelerate/sharding.py decides the share), which also

- moves each batch to the device;
- says whether the batch in hand is the last (`end_of_dataloader`: accumulate() then syncs and steps) and how
  many of its samples are real (`real_samples`: gather_for_metrics drops the repeats that complete the end);
- agrees on the shuffle with the other processes at the start of every pass, and advances the epoch of samplers
  and datasets that have `set_epoch` (a new shuffle each pass, as Accelerate does, even without set_epoch).

It keeps the user's dataset, collate_fn, workers and generator; only the sampling around them changes.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing
import sys
from collections import deque
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from runner.errors import ConfigError, Problem
from runner.accelerate.prepared import tree_map
from runner.accelerate.sharding import (
    BatchShard, IterableShard, WithReal, marking_last, sync_generators, with_agreed_shuffle,
)

log = logging.getLogger(__name__)

FORK_DEADLOCK_FIXED_IN = {(3, 10): (3, 10, 15), (3, 11): (3, 11, 10)}
"""CPython gh-112275: a child forked while another thread holds the interpreter's thread-state lock waits on it
for ever, in PyOS_AfterFork_Child. torch.distributed's gloo threads take that lock each time they free a finished
collective's tensors (pybind11 creates a thread state for the decref), so a DataLoader forking its workers right
after a collective hangs now and then (Accelerate's test_distributed_data_loop.py: 1 run in 145 on Python 3.11.7;
the worker's C stack ends in _PyThreadState_DeleteExcept). Fixed in these releases, and in 3.12."""


def loader_settings(loader: DataLoader) -> dict:
    """The settings of `loader` that are not about sampling, to re-make it with."""
    settings = dict(num_workers=loader.num_workers, pin_memory=loader.pin_memory, timeout=loader.timeout,
                    worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
                    generator=loader.generator, persistent_workers=loader.persistent_workers,
                    pin_memory_device=loader.pin_memory_device)
    if loader.num_workers > 0:
        settings["prefetch_factor"] = loader.prefetch_factor
    return settings


def fork_deadlock_risk(loader: DataLoader, num_processes: int, version: tuple = tuple(sys.version_info[:3])) -> str:
    """Why the workers of `loader` may hang at their start on this Python (FORK_DEADLOCK_FIXED_IN), or "" when
    they cannot: one process, no workers, workers not forked, or a Python with the fix."""
    fixed = FORK_DEADLOCK_FIXED_IN.get(tuple(version[:2]))
    if num_processes < 2 or loader.num_workers == 0 or fixed is None or tuple(version) >= fixed:
        return ""
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else (
        multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0])
    if method != "fork":
        return ""
    python = ".".join(map(str, version))
    return (f"DataLoader(num_workers={loader.num_workers}) forks its workers, and on Python {python} a worker "
            "forked while a torch.distributed thread frees a finished collective can hang for ever at its start "
            f"(CPython gh-112275, fixed in Python {'.'.join(map(str, fixed))}): upgrade Python, or give the "
            "DataLoader multiprocessing_context=\"forkserver\" (its dataset and collate_fn must then pickle)")


_warned: set[str] = set()


def warn_of_fork_deadlock(loader: DataLoader, num_processes: int) -> None:
    """Log fork_deadlock_risk once per process (a script prepares many loaders)."""
    risk = fork_deadlock_risk(loader, num_processes)
    if risk and risk not in _warned:
        _warned.add(risk)
        log.warning(risk)


def shard(loader: DataLoader, num_processes: int, process_index: int, config) -> tuple[DataLoader, Any]:
    """`loader` re-made to draw this process's share of its batches, and the BatchShard doing it (None for an
    IterableDataset, whose batches carry their real counts through WithReal)."""
    settings = loader_settings(loader)
    split, even = config.split_batches, config.even_batches
    if isinstance(loader.dataset, IterableDataset):
        batched = loader.batch_size is not None
        dataset = IterableShard(loader.dataset, loader.batch_size, num_processes, process_index, split, even,
                                loader.drop_last)
        return DataLoader(dataset, batch_size=dataset.per if batched else None,
                          collate_fn=WithReal(loader.collate_fn, batched), **settings), None
    if loader.batch_sampler is None:  # batch_size=None: each key the sampler yields fetches a whole batch
        if split:
            raise ConfigError(Problem("DataLoaderConfiguration.split_batches", (
                "cannot split the batches of a DataLoader with batch_size=None (its dataset returns whole "
                "batches, which the runner cannot cut); use split_batches=False, or let the DataLoader batch")))
        keys = with_agreed_shuffle(loader.sampler, config.use_seedable_sampler, config.data_seed, num_processes)
        sampler = BatchShard(keys, num_processes, process_index, False, even, None)
        return DataLoader(loader.dataset, batch_size=None, sampler=sampler, collate_fn=loader.collate_fn,
                          **settings), sampler
    source = with_agreed_shuffle(loader.batch_sampler, config.use_seedable_sampler, config.data_seed,
                                 num_processes)
    size = getattr(loader.batch_sampler, "batch_size", loader.batch_size)
    drop_last = getattr(loader.batch_sampler, "drop_last", loader.drop_last)
    sampler = BatchShard(source, num_processes, process_index, split, even, size, drop_last)
    return DataLoader(loader.dataset, batch_sampler=sampler, collate_fn=loader.collate_fn, **settings), sampler


class PreparedDataLoader:
    """This process's batches of a DataLoader, on the device (see the module docstring)."""

    def __init__(self, loader: DataLoader, num_processes: int, process_index: int, config, shared,
                 device: torch.device):
        self.original = loader
        self.loader, self.batch_shard = self._share(loader, num_processes, process_index, config)
        self.num_processes, self.process_index, self.split_batches = num_processes, process_index, config.split_batches
        self.shared, self.device, self.non_blocking = shared, device, config.non_blocking
        self.iteration = 0
        self.end_of_dataloader = False
        self.real_samples: int | None = None

    @staticmethod
    def _share(loader: DataLoader, num_processes: int, process_index: int, config) -> tuple[DataLoader, Any]:
        """The loader this process iterates, and the BatchShard choosing its batches (None where there is none)."""
        return shard(loader, num_processes, process_index, config)

    # Accelerate's DataLoaderShard exposes these
    @property
    def dataset(self):
        return self.original.dataset

    @property
    def batch_size(self):
        return self.original.batch_size

    @property
    def total_batch_size(self) -> int | None:
        """The samples of one step over all processes."""
        size = getattr(self.original.batch_sampler, "batch_size", self.original.batch_size)
        if size is None:
            return None
        return size if self.split_batches else size * self.num_processes

    @property
    def batch_sampler(self):
        return self.loader.batch_sampler

    @property
    def sampler(self):
        return self.loader.sampler

    def __len__(self) -> int:
        return max(0, len(self.loader) - self._skip_drawn)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass shuffles for (passed on to samplers and datasets that have set_epoch)."""
        self.iteration = epoch
        if self.batch_shard is not None:
            self.batch_shard.set_epoch(epoch)
        if hasattr(self.original.dataset, "set_epoch"):
            self.original.dataset.set_epoch(epoch)

    def skipping(self, num_batches: int) -> "PreparedDataLoader":
        """A copy that passes over this process's first `num_batches` batches on every pass (without loading
        them when the loader samples indices); the original is unchanged."""
        skipped = copy.copy(self)
        if self.batch_shard is None:  # an IterableDataset: the batches must be read to be passed over
            skipped._skip_drawn = num_batches
            return skipped
        skipped.batch_shard = copy.copy(self.batch_shard)
        skipped.batch_shard.reals, skipped.batch_shard.skip = deque(), num_batches
        if self.loader.batch_size is None and self.loader.batch_sampler is None:
            sampling = {"batch_size": None, "sampler": skipped.batch_shard}
        else:
            sampling = {"batch_sampler": skipped.batch_shard}
        skipped.loader = DataLoader(self.loader.dataset, collate_fn=self.loader.collate_fn, **sampling,
                                    **loader_settings(self.loader))
        return skipped

    _skip_drawn = 0

    def _batches(self) -> Iterator[tuple[Any, int | None]]:
        reals = self.batch_shard.reals if self.batch_shard is not None else None
        for index, batch in enumerate(self.loader):
            real = reals.popleft() if reals is not None else None
            if reals is None:
                batch, real = batch
            if index >= self._skip_drawn:
                yield batch, real

    def __iter__(self) -> Iterator[Any]:
        self.set_epoch(self.iteration)
        source = getattr(self.batch_shard, "batch_sampler", None)
        sync_generators(source, getattr(source, "sampler", None),
                        self.original.dataset if self.batch_shard is None else None)
        self.shared.loaders.append(self)
        try:
            for (batch, real), last in marking_last(self._batches()):
                self.end_of_dataloader, self.real_samples = last, real
                yield self._on_device(batch)
        finally:
            self.end_of_dataloader, self.real_samples = False, None
            if self in self.shared.loaders:
                self.shared.loaders.remove(self)
            self.iteration += 1

    def _on_device(self, batch: Any) -> Any:
        if self.device.type == "cpu":
            return batch
        return tree_map(lambda tensor: tensor.to(self.device, non_blocking=self.non_blocking), batch)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["end_of_dataloader"], state["real_samples"] = False, None
        return state
