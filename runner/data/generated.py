"""Datasets the project generates itself, so the default recipe and the tests need no download.

Built with `datasets.Dataset.from_generator`, which caches the Arrow files under HF_DATASETS_CACHE keyed by the
generator and its arguments: the second run with the same settings reads them back instead of regenerating.
"""

from __future__ import annotations

import numpy as np


def _digit_sequences(num_rows: int, seq_len: int, vocab_size: int, seed: int, operation: str):
    rng = np.random.default_rng(seed)
    sources = rng.integers(0, vocab_size, size=(num_rows, seq_len), dtype=np.int64)
    targets = sources[:, ::-1] if operation == "reverse" else np.sort(sources, axis=1)
    for source, target in zip(sources.tolist(), targets.tolist()):
        yield {"source": source, "target": target}


OPERATIONS = ("reverse", "sort")


def digit_sequences(
    operation: str = "reverse",
    num_train: int = 20000,
    num_validation: int = 2000,
    seq_len: int = 12,
    vocab_size: int = 10,
    seed: int = 1234,
):
    """Sequences of random digits (`source`) and the same digits reversed or sorted (`target`).

    The validation split comes from a different seed, so it is (almost surely) disjoint from training.
    """
    import datasets

    from runner.errors import ConfigError, Problem

    problems = [Problem(f"data.{name}", f"is {value}; it must be {least} or more") for name, value, least in
                (("num_train", num_train, 1), ("num_validation", num_validation, 1), ("seq_len", seq_len, 1),
                 ("vocab_size", vocab_size, 2)) if value < least]
    if operation not in OPERATIONS:
        problems.append(Problem("data.operation", f"'{operation}' is not an operation; choose one of {', '.join(OPERATIONS)}"))
    if problems:
        raise ConfigError(problems)
    features = datasets.Features(
        {
            "source": datasets.Sequence(datasets.Value("int64"), length=seq_len),
            "target": datasets.Sequence(datasets.Value("int64"), length=seq_len),
        }
    )

    def split(num_rows: int, split_seed: int):
        return datasets.Dataset.from_generator(
            _digit_sequences,
            features=features,
            gen_kwargs={
                "num_rows": num_rows,
                "seq_len": seq_len,
                "vocab_size": vocab_size,
                "seed": split_seed,
                "operation": operation,
            },
        )

    return datasets.DatasetDict({"train": split(num_train, seed), "validation": split(num_validation, seed + 1)})
