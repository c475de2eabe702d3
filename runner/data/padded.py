"""Variable-length token rows (a datasets list column) batched with padding to each batch's longest row.

A split that fits `trainer.data_in_memory_mb` is held as one flat tensor of ids plus row offsets; a larger one stays
in Arrow and each batch takes its rows from there. Either way a batch is padded by one gather and one mask, vectorised.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.data.batches import _Batches


class PaddedText:
    """A split of `input_ids` rows (any length) and `label`s; `make_batches` pads each batch with `pad_id`.
    `vocab_size`: the trained tokenizer's number of ids, which fills a null `model.vocab_size`."""

    def __init__(self, dataset, pad_id: int, vocab_size: int | None = None):
        self.dataset, self.pad_id, self.vocab_size = dataset, pad_id, vocab_size

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def features(self):
        """The split's schema (its label's ClassLabel fills a null model.num_classes)."""
        return self.dataset.features

    def make_batches(self, batch_size: int, shuffle: bool, seed: int, in_memory_limit_mb: int, drop_last=False):
        return PaddedBatches(self.dataset, self.pad_id, batch_size, shuffle, seed, in_memory_limit_mb, drop_last)


def _flat(column) -> tuple[torch.Tensor, torch.Tensor]:
    """A list column (Arrow) as (all values, one after the other; each row's length)."""
    import pyarrow.compute as pc

    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    values = torch.from_numpy(column.flatten().to_numpy(zero_copy_only=False).astype(np.int32))
    lengths = torch.from_numpy(pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64))
    return values, lengths


class PaddedBatches(_Batches):
    def __init__(self, dataset, pad_id: int, batch_size: int, shuffle: bool, seed: int, in_memory_limit_mb: int,
                 drop_last: bool = False):
        self.pad_id = pad_id
        self.table = dataset.with_format("arrow")
        self.in_memory = dataset.data.nbytes <= in_memory_limit_mb * 2**20
        if self.in_memory:
            whole = self.table[:]  # the split's rows (after any selection), as one Arrow table
            self.values, self.lengths = _flat(whole.column("input_ids"))
            self.starts = torch.cumsum(self.lengths, 0) - self.lengths
            self.labels = torch.from_numpy(whole.column("label").to_numpy().copy())
        super().__init__(len(dataset), batch_size, shuffle, seed, drop_last)

    def _fetch(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.in_memory:
            values, starts, lengths, labels = self.values, self.starts[rows], self.lengths[rows], self.labels[rows]
        else:
            batch = self.table[rows.tolist()]
            values, lengths = _flat(batch.column("input_ids"))
            starts, labels = torch.cumsum(lengths, 0) - lengths, torch.from_numpy(batch.column("label").to_numpy())
        positions = torch.arange(max(int(lengths.max()), 1))
        mask = positions < lengths[:, None]
        index = (starts[:, None] + positions).clamp(max=max(len(values) - 1, 0))
        ids = torch.where(mask, values[index] if len(values) else self.pad_id, self.pad_id)
        return {"input_ids": ids.long(), "attention_mask": mask.long(), "label": labels}
