"""Language-model data from the user's own text files: `datasets.load_dataset("text")`, a tokenizer trained on the
training split, and each split tokenised once into a token file in the datasets cache (see runner/data/tokens.py).

Everything is cached next to the datasets' own cache files (under HF_DATASETS_CACHE) and keyed by the files'
fingerprint and the tokenizer settings, so the launching process does the work once and the ranks, and the next run
on the same text, read it back. Nothing here holds the whole corpus in memory: the text is read, counted, trained on
and tokenised batch by batch.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from runner.data.tabular import read_files
from runner.data.tokenizers import _digest, save_tokenizer, trained
from runner.data.tokens import TokenStream
from runner.errors import ConfigError, DataError

log = logging.getLogger(__name__)

TEXT_BATCH = 10_000  # lines per batch when training the tokenizer and tokenising


def text_files(
    train: str | Sequence[str],
    tokenizer,
    block_size: int,
    validation: str | Sequence[str] | None = None,
    validation_fraction: float = 0.1,
    encoding: str = "utf-8",
    tokenizer_dir: str | None = None,
) -> dict[str, TokenStream]:
    """Token streams `train` and `validation` from text files (paths or glob patterns, relative to where the
    command ran). Without `validation` files the last `validation_fraction` of the training lines is held out, as
    nanoGPT holds out the end of its text. `tokenizer` is a spec from runner.data.tokenizers; the trained tokenizer
    is saved in `tokenizer_dir` (the recipes point it at `<run dir>/tokenizer`, where `runner.commands.sample` finds it)."""
    if block_size < 1:
        raise ConfigError("data.block_size", f"is {block_size}; it must be 1 or more")
    data_files = {"train": _files("data.train", train)}
    if validation is not None:
        data_files["validation"] = _files("data.validation", validation)
    # keep_linebreaks: the stream is the files' text exactly, newlines included (a character model learns them).
    lines = read_files("text", data_files, {"train": train, "validation": validation}, keep_linebreaks=True,
                       encoding=encoding)
    if "validation" not in lines:
        lines = _hold_out(lines["train"], validation_fraction)
    cache_dir = _cache_dir(lines["train"])
    train_texts = (batch["text"] for batch in lines["train"].iter(batch_size=TEXT_BATCH))
    trained_tokenizer = trained(tokenizer, train_texts, cache_dir, lines["train"]._fingerprint)
    key = _digest(lines["train"]._fingerprint, tokenizer.fingerprint())
    streams = {split: _token_file(lines[split], trained_tokenizer, cache_dir, key, block_size) for split in lines}
    if tokenizer_dir is not None:
        save_tokenizer(trained_tokenizer, Path(tokenizer_dir))
    log.info("text: %s tokens for training, %s for validation; %s tokenizer with %d ids%s",
             f"{streams['train'].num_tokens:,}", f"{streams['validation'].num_tokens:,}", trained_tokenizer.kind,
             trained_tokenizer.vocab_size, f", saved in {tokenizer_dir}" if tokenizer_dir else "")
    return streams


def _files(key: str, paths: str | Sequence[str]) -> list[str]:
    found = []
    for path in [paths] if isinstance(paths, str) else list(paths):
        path = os.path.expanduser(path)
        matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path] if Path(path).is_file() else []
        if not matches:
            raise DataError(f"{key}: no text file matches '{path}' (looked in {Path(path).resolve().parent}); give "
                            "a file, a list of files or a glob pattern, absolute or relative to where you ran the command")
        found += [str(Path(match).resolve()) for match in matches]
    if all(Path(file).stat().st_size == 0 for file in found):
        raise DataError(f"{key}: {', '.join(found)} {'is' if len(found) == 1 else 'are'} empty; give text to train on")
    return found


def _hold_out(lines, fraction: float):
    import datasets

    if not 0 < fraction < 1:
        raise ConfigError("data.validation_fraction", f"is {fraction}; it must lie between 0 and 1 (exclusive)")
    held_out = max(1, round(len(lines) * fraction))
    if held_out >= len(lines):
        raise DataError(f"data.train: {len(lines)} line(s) of text cannot be split into training and validation; "
                        "use more text or give data.validation files")
    # Contiguous ranges: slices of the same Arrow table, no index mapping.
    cut = len(lines) - held_out
    return datasets.DatasetDict({"train": lines.select(range(cut)), "validation": lines.select(range(cut, len(lines)))})


def _cache_dir(dataset) -> Path:
    import datasets

    if dataset.cache_files:
        return Path(dataset.cache_files[0]["filename"]).parent
    return Path(datasets.config.HF_DATASETS_CACHE) / "runner"


def _token_file(lines, tokenizer, cache_dir: Path, key: str, block_size: int) -> TokenStream:
    """Tokenise one split into `tokens-<fingerprint>.bin` (once; batch by batch, appended to the file)."""
    dtype = "uint16" if tokenizer.vocab_size <= 2**16 else "uint32"
    path = cache_dir / f"tokens-{_digest(key, lines._fingerprint)}.{dtype}.bin"
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        with open(partial, "wb") as out:
            for batch in lines.iter(batch_size=TEXT_BATCH):
                ids = tokenizer.encode_batch(batch["text"])
                if ids:
                    np.concatenate(ids).astype(dtype).tofile(out)
        os.replace(partial, path)  # complete or absent: a rank never reads half a file
    return TokenStream(path, dtype, block_size, tokenizer.vocab_size)
