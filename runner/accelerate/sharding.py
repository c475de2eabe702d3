"""Which of a DataLoader's batches each process draws: the batches the user's own sampler, batch sampler and
generator produce, dealt out whole (or split), never re-sampled. runner/accelerate/dataloader.py builds the loader around them.

On N processes with a batch sampler yielding [0, 1], [2, 3], [4, 5], [6, 7] (Accelerate's BatchSamplerShard is the
model for these rules):

- whole batches (default): process 0 draws [0, 1] then [4, 5], process 1 [2, 3] then [6, 7]: one step of two
  processes sees exactly what one step of one process with twice the batch sees, in the same order;
- `split_batches`: each batch is split, process 0 draws [0], [2], [4], [6] and process 1 [1], [3], [5], [7];
- the end: with `even_batches` the last global batch is completed with the first batch's samples (cycled; an
  IterableDataset's with the first global batch's, as Accelerate's IterableDatasetShard does), so every process
  takes the same number of steps with batches of one size, and each batch says how many of its samples are real
  (what `gather_for_metrics` keeps); without it the last processes get fewer (or shorter) batches; a batch
  sampler with drop_last drops the incomplete tail.

An IterableDataset is dealt out the same way sample by sample (`IterableShard`): every process reads the stream
and keeps its part of each global batch. Shuffling: a plain RandomSampler is replaced by one whose permutation
every process agrees on (`AgreedRandomSampler`: rank 0's seed, drawn exactly where RandomSampler draws it, or the
user's generator synchronised from rank 0), so one process reproduces N processes at N times the batch.
"""

from __future__ import annotations

import copy
from collections import deque
from itertools import chain
from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, Sampler

from runner.distributed import dist
from runner.errors import ConfigError, Problem


def complete(units: list, first: list, size: int) -> list:
    """`units` completed to `size` with units from `first` (cycled, for data smaller than one global batch)."""
    source = first or list(units)
    return list(units) + [source[i % len(source)] for i in range(size - len(units))]


def real_in_slice(real_total: int, start: int, length: int) -> int:
    """How many of the positions start .. start+length-1 fall among the first `real_total` (the real ones)."""
    return max(0, min(length, real_total - start))


def marking_last(iterable) -> Iterator[tuple[Any, bool]]:
    """(item, whether it is the last one), looking one item ahead."""
    iterator = iter(iterable)
    current = next(iterator, _END)
    while current is not _END:
        following = next(iterator, _END)
        yield current, following is _END
        current = following


_END = object()


class BatchShard(Sampler):
    """This process's batches of `batch_sampler` (lists of indices; or any keys the dataset takes, one per batch,
    when the loader batches nothing itself). `reals` holds, in order, how many samples of each batch handed out
    are real, for the loader to read as the batches arrive (prefetching workers keep that order)."""

    def __init__(self, batch_sampler, num_processes: int, process_index: int, split_batches: bool = False,
                 even_batches: bool = True, batch_size: int | None = None, drop_last: bool = False):
        self.batch_sampler, self.num_processes, self.process_index = batch_sampler, num_processes, process_index
        self.split_batches, self.even_batches = split_batches, even_batches
        self.batch_size, self.drop_last = batch_size, drop_last
        self.skip = 0  # batches of this process to pass over (without loading them) on every pass
        self.reals: deque[int | None] = deque()
        if split_batches and (batch_size is None or batch_size % num_processes):
            raise ConfigError(Problem("DataLoaderConfiguration.split_batches", (
                f"needs a batch size that divides by the {num_processes} processes, but the loader's is "
                f"{batch_size}; use a batch size that is a multiple of {num_processes}, or split_batches=False")))

    def __len__(self) -> int:
        total, n = len(self.batch_sampler), self.num_processes
        if self.split_batches or n == 1:
            length = total
        elif total % n == 0 or self.drop_last:
            length = total // n
        elif self.even_batches:
            length = total // n + 1
        else:
            length = total // n + (self.process_index < total % n)
        return max(0, length - self.skip)

    def __iter__(self) -> Iterator[Any]:
        self.reals.clear()
        skip = self.skip
        if self.num_processes == 1:  # nothing to deal out (and nothing to complete: one process is the plain loader)
            pieces = ((batch, None) for batch in self.batch_sampler)
        else:
            pieces = self._split() if self.split_batches else self._whole()
        for index, (keys, real) in enumerate(pieces):
            if index >= skip:
                self.reals.append(None if real and real >= len(keys) else real)  # None: every sample is real
                yield keys

    def _whole(self) -> Iterator[tuple[Any, int | None]]:
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        group, first = [], []
        for batch, last in marking_last(self.batch_sampler):
            group.append(batch)
            # A short last batch makes its group the tail, which the end completes.
            if len(group) == n and not (last and size is not None and len(batch) < size):
                first = first or list(group)  # Accelerate completes the end from the first n batches, as here
                yield group[rank], None
                group = []
        if not group or self.drop_last:
            return
        first = first or list(group)
        if not self.even_batches:
            if rank < len(group):
                yield group[rank], None
        elif size is None:  # batches of their own sizes: whole batches from the start stand in, all padding
            yield complete(group, first, n)[rank], (None if rank < len(group) else 0)
        else:
            flat = list(chain.from_iterable(group))
            keys = complete(flat, list(chain.from_iterable(first)), n * size)[rank * size:(rank + 1) * size]
            yield keys, real_in_slice(len(flat), rank * size, size)

    def _split(self) -> Iterator[tuple[Any, int | None]]:
        size = self.batch_size
        per, start = size // self.num_processes, self.process_index * (size // self.num_processes)
        first = []
        for batch in self.batch_sampler:
            batch = list(batch)
            first = first or batch
            if len(batch) == size:
                yield batch[start:start + per], None
            elif self.even_batches:
                yield complete(batch, first, size)[start:start + per], real_in_slice(len(batch), start, per)
            elif len(batch) > start:
                yield batch[start:start + per], None

    def set_epoch(self, epoch: int) -> None:
        for obj in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)


class IterableShard(IterableDataset):
    """This process's samples of an IterableDataset, each paired with whether it is real (not a repeat that
    completes the last global batch); `WithReal` collates the pairs. `batch_size` None: each item is a batch."""

    def __init__(self, dataset, batch_size: int | None, num_processes: int, process_index: int,
                 split_batches: bool = False, even_batches: bool = True, drop_last: bool = False):
        if split_batches and batch_size is not None and batch_size % num_processes:
            raise ConfigError(Problem("DataLoaderConfiguration.split_batches", (
                f"needs a batch size that divides by the {num_processes} processes, but the loader's is "
                f"{batch_size}; use a multiple of {num_processes}, or split_batches=False")))
        self.dataset, self.num_processes, self.process_index = dataset, num_processes, process_index
        per = 1 if batch_size is None else (batch_size // num_processes if split_batches else batch_size)
        self.per, self.global_size = per, per * num_processes
        self.even_batches, self.drop_last = even_batches, drop_last

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Samples this process draws (an unsized stream raises TypeError, as the plain loader does)."""
        total, size = len(self.dataset), self.global_size
        if self.num_processes == 1:
            return total
        if self.drop_last:
            return total // size * self.per
        if self.even_batches:
            return -(-total // size) * self.per
        return total // size * self.per + real_in_slice(total % size, self.process_index * self.per, self.per)

    def __iter__(self) -> Iterator[tuple[Any, bool]]:
        if self.num_processes == 1:  # one process is the plain loader: nothing to deal out or complete
            yield from ((item, True) for item in self.dataset)
            return
        start, per = self.process_index * self.per, self.per
        group, first = [], []
        for sample in self.dataset:
            group.append(sample)
            if len(group) == self.global_size:
                first = first or group
                yield from ((item, True) for item in group[start:start + per])
                group = []
        if not group or self.drop_last:
            return
        real = real_in_slice(len(group), start, per)
        mine = complete(group, first, self.global_size)[start:start + per] if self.even_batches else group[start:]
        yield from ((item, index < real) for index, item in enumerate(mine[:per]))


class WithReal:
    """A collate function over (sample, is_real) pairs: (the user's collated batch, how many are real)."""

    def __init__(self, collate_fn, batched: bool):
        self.collate_fn, self.batched = collate_fn, batched

    def __call__(self, pairs):
        if not self.batched:  # batch_size=None: one item, itself a batch
            item, real = pairs
            return self.collate_fn(item), (None if real else 0)
        real = sum(flag for _, flag in pairs)
        return self.collate_fn([item for item, _ in pairs]), (None if real == len(pairs) else real)


class AgreedRandomSampler(RandomSampler):
    """A RandomSampler whose permutation every process agrees on, drawn as Accelerate draws it. With the user's
    generator: its state synchronised from rank 0 at every pass (Accelerate's synchronize_rng_states). With none,
    on several processes: a generator seeded once, here at prepare, from the global RNG (the draw RandomSampler
    would make), then synchronised from rank 0 and continued pass after pass, as Accelerate's prepare_data_loader
    does; on one process: a seed drawn from the global RNG at every pass, as the plain sampler does (Accelerate
    leaves a one-process loader as it is)."""

    def __init__(self, sampler: RandomSampler, num_processes: int = 1):
        generator = sampler.generator
        if generator is None and num_processes > 1:
            generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        super().__init__(sampler.data_source, sampler.replacement, sampler._num_samples, generator)

    def __iter__(self) -> Iterator[int]:
        generator = self.generator
        if generator is None:
            seed = torch.empty((), dtype=torch.int64).random_()  # what RandomSampler draws, where it draws it
            generator = torch.Generator().manual_seed(int(dist.broadcast(seed)))
        else:
            generator.set_state(dist.broadcast(generator.get_state()))
        yield from RandomSampler(self.data_source, self.replacement, self._num_samples, generator)


class SeededRandomSampler(AgreedRandomSampler):
    """`use_seedable_sampler`: each pass shuffles with `seed + epoch`, the same on every process without asking."""

    def __init__(self, sampler: RandomSampler, seed: int | None):
        super().__init__(sampler)  # (its generator, if any, is reseeded every pass: no draw at prepare)
        self.seed = torch.initial_seed() if seed is None else seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = self.generator or torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from RandomSampler(self.data_source, self.replacement, self._num_samples, generator)


def with_agreed_shuffle(source, seedable: bool, data_seed: int | None, num_processes: int = 1):
    """`source` (a batch sampler, or a sampler of whole batches) with a plain RandomSampler inside it replaced by
    an agreeing one; copies, never edits, the user's objects. Custom samplers are kept as they are."""
    def agreeing(sampler):
        return SeededRandomSampler(sampler, data_seed) if seedable else AgreedRandomSampler(sampler, num_processes)

    if type(source) is RandomSampler:
        return agreeing(source)
    if isinstance(source, BatchSampler) and type(getattr(source, "sampler", None)) is RandomSampler:
        source = copy.copy(source)
        source.sampler = agreeing(source.sampler)
    return source


def sync_generators(*objects) -> None:
    """Give every process rank 0's state of any torch.Generator the objects hold as `generator` (custom samplers,
    iterable datasets): what Accelerate's default rng_types=["generator"] does at the start of each pass."""
    for obj in objects:
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator) and not isinstance(obj, AgreedRandomSampler):
            generator.set_state(dist.broadcast(generator.get_state()))
