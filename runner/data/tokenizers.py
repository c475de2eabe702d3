"""Tokenizers for text data: trained on the training split (characters, byte-level BPE) or a `transformers` one.

A recipe picks one with a `_target_` under `data.tokenizer` (conf/tokenizer/). Each of these is a *spec*: the data
factory calls `train(batches of training texts)` once, and gets back a trained tokenizer that encodes whole batches
at a time and saves itself (`save(directory)`); `load_tokenizer(directory)` reads any of them back.

`vocab_size` on a spec is the size of the model's vocabulary: the tokenizer's ids all lie below it (it caps the
characters kept, sets BPE's target size, and is checked against a pretrained tokenizer), so a recipe can set
`model.vocab_size: ${data.tokenizer.vocab_size}` before any text is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np

from runner.errors import ConfigError, DataError

PAD, UNK = "<pad>", "<unk>"
CHAR_FILE = "vocab.json"  # character-level: {"kind": "char", "tokens": [...]}
TOKENIZERS_FILE = "tokenizer.json"  # HuggingFace tokenizers' own format (byte-level BPE)
TRANSFORMERS_FILE = "tokenizer_config.json"  # written by a transformers tokenizer's save_pretrained


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_cap(vocab_size: int) -> None:
    if vocab_size < 3:
        raise ConfigError("data.tokenizer.vocab_size", f"is {vocab_size}; it must be 3 or more (2 special ids + text)")


# -- character level ----------------------------------------------------------------------------------------------

class CharLevel:
    """One id per character of the training text: <pad> = 0, <unk> = 1 (characters the training text lacks, or
    beyond the `vocab_size` most frequent ones), then the kept characters in code-point order."""

    def __init__(self, vocab_size: int = 256):
        _check_cap(vocab_size)
        self.vocab_size = vocab_size

    def fingerprint(self) -> str:
        return _digest("char", self.vocab_size)

    def train(self, batches: Iterable[list[str]]) -> "CharTokenizer":
        counts: Counter = Counter()
        for texts in batches:
            points, seen = np.unique(_code_points("".join(texts)), return_counts=True)
            counts.update(dict(zip(points.tolist(), seen.tolist())))
        kept = [point for point, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))][: self.vocab_size - 2]
        return CharTokenizer([PAD, UNK] + [chr(point) for point in sorted(kept)])


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


class CharTokenizer:
    kind = "char"

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.vocab_size = len(tokens)
        self.pad_id, self.unk_id = 0, 1
        self.special_ids = (0, 1)
        self._points = np.array([ord(token) for token in tokens[2:]], dtype=np.uint32)  # sorted
        self._lookup = np.array(tokens, dtype=object)

    def encode(self, text: str) -> np.ndarray:
        """Every character's id, vectorised: one searchsorted over the text's code points."""
        points = _code_points(text)
        where = np.searchsorted(self._points, points).clip(max=max(len(self._points) - 1, 0))
        found = self._points[where] == points if len(self._points) else np.zeros(len(points), bool)
        return np.where(found, where + 2, self.unk_id).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.encode("".join(texts))
        return np.split(ids, np.cumsum([len(text) for text in texts])[:-1])

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[(ids > self.pad_id) & (ids < self.vocab_size)]
        return "".join(self._lookup[ids].tolist())

    def save(self, directory: Path) -> None:
        _write_atomically(directory / CHAR_FILE, json.dumps({"kind": self.kind, "tokens": self.tokens}, ensure_ascii=False))


# -- byte-level BPE (HuggingFace tokenizers) ---------------------------------------------------------------------

class BytePairEncoding:
    """GPT-2-style byte-level BPE trained on the training text with HuggingFace `tokenizers`: any text encodes
    (no unknown tokens), merges are learnt up to `vocab_size` ids (fewer on a small corpus); <pad> = 0."""

    def __init__(self, vocab_size: int = 4096, min_frequency: int = 2):
        _check_cap(vocab_size)
        self.vocab_size, self.min_frequency = vocab_size, min_frequency

    def fingerprint(self) -> str:
        import tokenizers

        return _digest("bpe", self.vocab_size, self.min_frequency, tokenizers.__version__)

    def train(self, batches: Iterable[list[str]]) -> "TokenizersTokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if self.vocab_size < 256 + 2:
            raise ConfigError("data.tokenizer.vocab_size", f"is {self.vocab_size}; byte-level BPE needs at least 258 "
                              "(256 byte tokens, <pad> and <|endoftext|>)")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.vocab_size, min_frequency=self.min_frequency, special_tokens=[PAD, "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tokenizer.train_from_iterator(batches, trainer=trainer)
        return TokenizersTokenizer(tokenizer)


class TokenizersTokenizer:
    kind = "bpe"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.pad_id = tokenizer.token_to_id(PAD)
        self.special_ids = tuple(tokenizer.token_to_id(token) for token in (PAD, "<|endoftext|>"))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # The Rust side encodes the batch in parallel.
        return [np.asarray(encoding.ids, dtype=np.int32) for encoding in self.tokenizer.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def save(self, directory: Path) -> None:
        _write_atomically(directory / TOKENIZERS_FILE, self.tokenizer.to_str())


# -- a transformers tokenizer by name -----------------------------------------------------------------------------

class Pretrained:
    """A `transformers` tokenizer by Hub name or local directory (the `transformers` extra). Offline, a
    name that is not in the Hugging Face cache fails in seconds, naming the cache to fill."""

    def __init__(self, name: str, vocab_size: int):
        self.name, self.vocab_size = name, vocab_size

    def fingerprint(self) -> str:
        return _digest("pretrained", self.name, self.vocab_size)

    def train(self, batches: Iterable[list[str]]) -> "TransformersTokenizer":
        from runner.hub import load_pretrained

        tokenizer = load_pretrained("AutoTokenizer", self.name, "data.tokenizer.name")
        if len(tokenizer) > self.vocab_size:
            raise ConfigError("data.tokenizer.vocab_size", f"is {self.vocab_size}, but '{self.name}' has "
                              f"{len(tokenizer)} tokens; set data.tokenizer.vocab_size={len(tokenizer)} or more")
        return TransformersTokenizer(tokenizer)


class TransformersTokenizer:
    kind = "pretrained"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.special_ids = tuple(tokenizer.all_special_ids)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(ids, dtype=np.int32) for ids in encoded]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def save(self, directory: Path) -> None:
        self.tokenizer.save_pretrained(str(directory))


# -- reading back ---------------------------------------------------------------------------------------------------

def load_tokenizer(directory: Path):
    """The tokenizer a run saved in `directory` (`<run dir>/tokenizer`), whichever kind it is."""
    directory = Path(directory)
    if (directory / CHAR_FILE).is_file():
        saved = json.loads((directory / CHAR_FILE).read_text(encoding="utf-8"))
        if saved.get("kind") == CharTokenizer.kind:
            return CharTokenizer(saved["tokens"])
    if (directory / TRANSFORMERS_FILE).is_file():
        from transformers import AutoTokenizer

        return TransformersTokenizer(AutoTokenizer.from_pretrained(str(directory)))
    if (directory / TOKENIZERS_FILE).is_file():
        from tokenizers import Tokenizer

        return TokenizersTokenizer(Tokenizer.from_file(str(directory / TOKENIZERS_FILE)))
    raise DataError(f"no saved tokenizer in {directory} (looked for {CHAR_FILE}, {TOKENIZERS_FILE}, {TRANSFORMERS_FILE})")


def trained(spec, batches: Iterable[list[str]], cache_dir: Path, corpus_fingerprint: str):
    """`spec.train(batches)`, once per corpus and spec: later calls (other ranks, the next run) read the cache."""
    cached = cache_dir / f"tokenizer-{_digest(corpus_fingerprint, spec.fingerprint())}"
    if cached.is_dir():
        return load_tokenizer(cached)
    tokenizer = spec.train(batches)
    partial = cache_dir / f".{cached.name}.{os.getpid()}.partial"
    save_tokenizer(tokenizer, partial)
    try:
        os.rename(partial, cached)  # whole, or not at all: a reader never sees half a tokenizer
    except OSError:  # another process cached it first
        shutil.rmtree(partial, ignore_errors=True)
    return tokenizer


def save_tokenizer(tokenizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(directory)


def _write_atomically(path: Path, text: str) -> None:
    """Ranks and the launching process may save the same tokenizer at once: each renames its own complete file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
