"""Text classification data from the user's CSV / JSON Lines / Parquet file of (text, label) rows.

A tokenizer (conf/tokenizer/) is trained on the training texts, every text is tokenised once (a batched, cached
`datasets.map`, truncated to `max_length`), and batches are padded to their own longest text: `input_ids` (padding:
the tokenizer's <pad> id), `attention_mask` (1 for tokens, 0 for padding) and `label`. Padding is a few tensor ops
per batch (runner.data.padded), never a Python loop over samples.
"""

from __future__ import annotations

from pathlib import Path

from runner.data.padded import PaddedText
from runner.data.tokenizers import _digest, save_tokenizer, trained
from runner.data.tabular import read_files, refuse_folder
from runner.errors import ConfigError, DataError

FILE_FORMATS = ("csv", "json", "parquet")


def text_classification(train: str, tokenizer, validation: str | None = None, format: str | None = None,
                        text_column: str = "text", label_column: str = "label", max_length: int = 128,
                        validation_fraction: float = 0.2, seed: int = 0, tokenizer_dir: str | None = None):
    import datasets

    from runner.data.tabular import _label_encoder

    if max_length < 1:
        raise ConfigError("data.max_length", f"is {max_length}; it must be 1 or more")
    loaded = labelled_texts(train, validation, format, text_column, label_column, validation_fraction, seed)
    encode_labels, classes = _label_encoder(loaded, label_column)
    texts = (batch[text_column] for batch in loaded["train"].iter(batch_size=10_000))
    cache_dir = Path(loaded["train"].cache_files[0]["filename"]).parent if loaded["train"].cache_files else None
    tokenizer_trained = trained(tokenizer, texts, cache_dir or Path(datasets.config.HF_DATASETS_CACHE) / "runner",
                                loaded["train"]._fingerprint)

    def tokenize(batch):
        ids = tokenizer_trained.encode_batch([str(text) for text in batch[text_column]])
        return {"input_ids": [row[:max_length] for row in ids], "label": encode_labels(batch[label_column])}

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")), "label": classes})
    tokenized = {
        split: table.map(tokenize, batched=True, remove_columns=table.column_names, features=features,
                         new_fingerprint=_digest(table._fingerprint, loaded["train"]._fingerprint,
                                                 tokenizer.fingerprint(), max_length, text_column, label_column))
        for split, table in loaded.items()
    }
    if tokenizer_dir is not None:
        save_tokenizer(tokenizer_trained, Path(tokenizer_dir))
    return {split: PaddedText(table, tokenizer_trained.pad_id, tokenizer_trained.vocab_size)
            for split, table in tokenized.items()}


def labelled_texts(train: str, validation: str | None = None, format: str | None = None, text_column: str = "text",
                   label_column: str = "label", validation_fraction: float = 0.2, seed: int = 0):
    """The file's (text, label) rows as a DatasetDict of `train` and `validation`, before tokenising: without
    `validation` files, `validation_fraction` of the training rows is held out (datasets' train_test_split with
    `seed`). benchmarks/baselines.py scores its scikit-learn baselines on these very rows."""
    import datasets

    paths = {"train": train} if validation is None else {"train": train, "validation": validation}
    for split, path in paths.items():
        refuse_folder(split, path, f"a {'/'.join(FILE_FORMATS)}")
        if not Path(path).expanduser().is_file():
            raise DataError(f"data.{split}: no such file '{path}'; give a {'/'.join(FILE_FORMATS)} file of texts "
                            "and labels, absolute or relative to where you ran the command")
    format = (format or Path(train).suffix.lstrip(".")).lower()
    format = "json" if format == "jsonl" else format
    if format not in FILE_FORMATS:
        raise ConfigError("data.format",
                          f"'{format}' is not a file format this reads; choose one of {', '.join(FILE_FORMATS)}")
    files = {split: str(Path(path).expanduser().resolve()) for split, path in paths.items()}
    loaded = read_files(format, files, paths)
    for key, column in (("data.text_column", text_column), ("data.label_column", label_column)):
        if column not in loaded["train"].column_names:
            raise ConfigError(key, f"'{column}' is not a column of the data; columns are "
                                   f"{', '.join(loaded['train'].column_names)}")
    for split, table in loaded.items():
        check_texts(table, f"data.{split}", paths[split], text_column, label_column)
    if "validation" not in loaded:
        held_out = loaded["train"].train_test_split(test_size=validation_fraction, seed=seed)
        loaded = datasets.DatasetDict({"train": held_out["train"], "validation": held_out["test"]})
    return loaded


def check_texts(table, key: str, source: str, text_column: str, label_column: str) -> None:
    """What the tokenizer and the label encoder cannot take, named by column and row (rows count from 1, the header
    aside): an empty text or label, or a text column that holds numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for column, what in ((text_column, "text"), (label_column, "label")):
        values = table.data.column(column)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py() + 1
            raise DataError(f"{key}: {source}, column '{column}', row {row} is empty; every row needs a {what}: "
                            "fill or drop such rows")
    texts = table.data.column(text_column)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise DataError(f"{key}: {source}, column '{text_column}' holds {texts.type} values, not text (row 1: "
                        f"{texts[0].as_py()!r}); data.text_column names the column of texts")
