"""`DataLoaderConfiguration(dispatch_batches=True)`: only the main process reads the user's loader; it sends every
process the step's batch and each keeps its slice, as Accelerate's DataLoaderDispatcher does. For a source only
one process can read (a stream, a queue), or a collate_fn too costly to run on every process.

A step is, on the main process, `num_processes` batches of the loader put end to end (one batch with
split_batches=True); process i keeps rows [i*b, (i+1)*b) of it, b = rows // num_processes. A last step whose rows do
not divide by the number of processes is completed, unless the loader drops its last batch, with the first
`num_processes` rows of the pass (b one more): gather_for_metrics drops those again, each process's `real_samples`
saying how many of its rows are the step's own. A loader that drops its last batch drops a short last step.

The step travels as one broadcast object (torch.distributed pickles it on the main process and unpickles it on
the others of the same job), where Accelerate broadcasts its structure and then each tensor: one collective a
step to keep in step (its speed against Accelerate's is not measured). A batch is a tensor or any nesting of
mappings, lists and tuples of tensors; anything else is refused naming its type.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Sampler

from runner.distributed import dist
from runner.accelerate.dataloader import PreparedDataLoader, loader_settings
from runner.accelerate.sharding import SeededRandomSampler


class DispatchedDataLoader(PreparedDataLoader):
    """This process's slice of each step the main process read and sent (see the module docstring)."""

    @staticmethod
    def _share(loader: DataLoader, num_processes: int, process_index: int, config) -> tuple[DataLoader, None]:
        """Every process keeps the user's loader (the main process alone iterates it), its shuffle seeded from
        data_seed + epoch with use_seedable_sampler."""
        return (_with_seeded_shuffle(loader, config.data_seed) if config.use_seedable_sampler else loader), None

    @property
    def drop_last(self) -> bool:
        """The user's loader's (a skipping copy iterates a loader re-made around a batch sampler)."""
        return self.original.drop_last

    def __len__(self) -> int:
        whole = len(self.loader)
        if self.split_batches:
            steps = whole
        else:
            steps = whole // self.num_processes if self.drop_last else math.ceil(whole / self.num_processes)
        return max(0, steps - self._skip_drawn)

    def set_epoch(self, epoch: int) -> None:
        self.iteration = epoch
        for holder in (getattr(self.loader, "batch_sampler", None), self.loader.sampler, self.loader.dataset):
            if hasattr(holder, "set_epoch"):
                holder.set_epoch(epoch)
                return

    def skipping(self, num_batches: int) -> "DispatchedDataLoader":
        """A copy that passes over the loader's first `num_batches` batches on every pass, as Accelerate's
        skip_first_batches does for its dispatcher: the loader's own batches (not loaded), so with whole batches a
        step reads num_processes of them. For an IterableDataset (or batch_size=None) the first `num_batches`
        slices of each process are passed over instead, also as in Accelerate."""
        skipped = type(self).__new__(type(self))
        skipped.__dict__.update(self.__dict__)
        if self.loader.batch_sampler is None or isinstance(self.loader.dataset, IterableDataset):
            skipped._skip_drawn = num_batches
        else:
            skipped.loader = DataLoader(self.loader.dataset, batch_sampler=SkipBatches(self.loader.batch_sampler,
                                                                                       num_batches),
                                        collate_fn=self.loader.collate_fn, **loader_settings(self.loader))
        return skipped

    def _steps(self) -> Iterator[Any]:
        """Main process: the loader's batches, `num_processes` of them end to end per step (one when split)."""
        reading = iter(self.loader)
        per_step = 1 if self.split_batches else self.num_processes
        while True:
            group = [batch for _, batch in zip(range(per_step), reading)]
            if not group or (len(group) < per_step and self.drop_last):
                return
            yield concatenate(group) if len(group) > 1 else group[0]

    def _batches(self) -> Iterator[tuple[Any, int | None]]:
        steps = self._steps() if self.process_index == 0 else None
        ahead = next(steps, None) if steps is not None else None
        first_rows, index = None, 0
        while True:
            message = None
            if steps is not None:  # one step read ahead: a step is known to be the last before it is sent
                step, ahead = ahead, (next(steps, None) if ahead is not None else None)
                message = (step, ahead is None)
            step, last = dist.broadcast_object(message)
            if step is None:
                return
            rows = batch_rows(step)
            if first_rows is None and not self.drop_last:
                first_rows = slice_rows(step, 0, self.num_processes)
            each = rows // self.num_processes
            if last and not self.drop_last and rows % self.num_processes:
                step, each = concatenate([step, first_rows]), each + 1
            start = self.process_index * each
            real = max(0, min(each, rows - start)) if last else None
            if index >= self._skip_drawn:
                yield slice_rows(step, start, start + each), (None if real == each else real)
            index += 1
            if last:
                return


class SkipBatches(Sampler):
    """A batch sampler without its first `skip` batches."""

    def __init__(self, batch_sampler, skip: int):
        self.batch_sampler, self.skip = batch_sampler, skip

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.batch_sampler, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)


def _with_seeded_shuffle(loader: DataLoader, data_seed: int | None) -> DataLoader:
    """use_seedable_sampler: the loader's plain RandomSampler shuffled with data_seed + epoch (only the main
    process reads it, so nothing needs agreeing)."""
    if type(loader.sampler) is not RandomSampler or loader.batch_sampler is None:
        return loader
    sampler = SeededRandomSampler(loader.sampler, data_seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last,
                      collate_fn=loader.collate_fn, **loader_settings(loader))


def _refuse(batch: Any) -> TypeError:
    return TypeError(f"DataLoaderConfiguration(dispatch_batches=True): a batch holds a {type(batch).__name__}; "
                     "the main process can only send tensors, or mappings, lists and tuples of them. Use "
                     "dispatch_batches=False (every process reads its own batches)")


def concatenate(batches: list) -> Any:
    """Batches of the same structure, end to end along the first dimension."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.cat(batches, dim=0)
        except RuntimeError as err:
            raise ValueError("DataLoaderConfiguration(dispatch_batches=True): the main process cannot put these "
                             f"batches end to end ({err}); give the loader batches whose rows have one shape (pad "
                             "them in collate_fn), or use dispatch_batches=False") from None
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([batch[key] for batch in batches]) for key in first})
    if isinstance(first, (list, tuple)):
        parts = [concatenate(list(column)) for column in zip(*batches)]
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    raise _refuse(first)


def slice_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows [start, stop) of every tensor in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return type(batch)({key: slice_rows(value, start, stop) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        parts = [slice_rows(value, start, stop) for value in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    raise _refuse(batch)


def batch_rows(batch: Any) -> int:
    """The rows of the first tensor in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    values = list(batch.values()) if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) and values:
        return batch_rows(values[0])
    raise _refuse(batch)
