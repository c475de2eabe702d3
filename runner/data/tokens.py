"""A split that is one long stream of token ids in a file (like nanoGPT's train.bin), and its batch source.

Training batches are blocks of `block_size + 1` consecutive tokens drawn from the stream: `input_ids` is a block's
first `block_size` tokens and `labels` the same shifted by one (the next token at every position). An epoch is one
pass over the stream in non-overlapping blocks, taken in a shuffled order, starting at a random offset in
[0, block_size) so that every epoch cuts the text at other places; the order and the offset come from
`seed + epoch`, so a resumed run or another rank recomputes them. Evaluation reads every block once, in order.

A stream that fits `trainer.data_in_memory_mb` is read into memory once; a larger one stays a memory-mapped file, and
each batch reads only its own blocks' pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from runner.data.batches import _Batches
from runner.errors import DataError

IN_MEMORY_DTYPE = np.int32  # what a stream held in memory takes per token (the file holds uint16 when ids fit)


@dataclass(frozen=True)
class TokenStream:
    """A split of token ids stored in `path` (raw `dtype` values), cut into blocks of `block_size`; `vocab_size`:
    the trained tokenizer's number of ids (every id lies below it), which fills a null `model.vocab_size`."""

    path: Path
    dtype: str
    block_size: int
    vocab_size: int | None = None

    @property
    def num_tokens(self) -> int:
        return self.path.stat().st_size // np.dtype(self.dtype).itemsize

    def __len__(self) -> int:
        return self.num_tokens

    def tokens(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r")

    def make_batches(self, batch_size: int, shuffle: bool, seed: int, in_memory_limit_mb: int, drop_last=False):
        """The batch source `runner.data.make_batches` hands the loop for this split."""
        tokens = self.tokens()
        if self.num_tokens * np.dtype(IN_MEMORY_DTYPE).itemsize <= in_memory_limit_mb * 2**20:
            tokens = torch.from_numpy(tokens.astype(IN_MEMORY_DTYPE))
        return TokenBlocks(tokens, self.block_size, batch_size, shuffle, seed, drop_last)


class TokenBlocks(_Batches):
    """Batches of {"input_ids", "labels"} (int64, batch x block_size) cut from a token tensor or memory map."""

    def __init__(self, tokens, block_size: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool = False):
        # Training shifts every epoch's blocks by up to block_size - 1 tokens, so one block fewer fits.
        blocks = (len(tokens) // block_size - 1) if shuffle else (len(tokens) - 1) // block_size
        if blocks < 1:
            raise DataError(f"data.block_size: a split has {len(tokens)} tokens, too few for one block of "
                            f"{block_size} + 1; use more text or a smaller data.block_size")
        self.tokens, self.block_size = tokens, block_size
        self.window = torch.arange(block_size + 1)
        self.offset = 0
        super().__init__(blocks, batch_size, shuffle, seed, drop_last)

    def __iter__(self):
        if self.shuffle:  # this epoch's cut: the same on every rank and after a resume
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            self.offset = int(torch.randint(self.block_size, (1,), generator=generator))
        return super().__iter__()

    def _fetch(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        index = (rows * self.block_size + self.offset).unsqueeze(1) + self.window  # one gather for the whole batch
        if isinstance(self.tokens, torch.Tensor):
            blocks = self.tokens[index].long()
        else:  # a memory map: numpy reads just these blocks from the file
            blocks = torch.from_numpy(self.tokens[index.numpy()].astype(np.int64))
        return {"input_ids": blocks[:, :-1], "labels": blocks[:, 1:]}
