"""Tabular classification datasets: the user's own files, a dataset a package ships, or a Hub dataset.

Every factory returns a `datasets.DatasetDict` with `train` and `validation` splits holding two columns:
`features` (a fixed-length float32 list) and `label` (a ClassLabel: int64 class index, with the class count and
names in the schema), which `runner.training.tasks.Classification` reads by default. The schema is what fills a model's
null `in_features` / `out_features` (runner/data/shapes.py).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from runner.errors import ConfigError, DataError, first_line
from runner.ground import install_hint
from runner.hub import hub_unreachable

log = logging.getLogger(__name__)

FILE_FORMATS = ("csv", "json", "parquet")
FLOAT32_MAX = 3.4028234663852886e38


def refuse_folder(split: str, path, wanted: str) -> None:
    """data.<split> names a folder where a file is read: say so (not "no such file", which it is not)."""
    if Path(path).expanduser().is_dir():
        raise DataError(f"data.{split}: '{path}' is a folder, not a file; give the path of {wanted} file in it")


def local_files(
    train: str,
    validation: str | None = None,
    format: str | None = None,
    label_column: str = "label",
    feature_columns: Sequence[str] | None = None,
    validation_fraction: float = 0.2,
    seed: int = 0,
):
    """Read the user's CSV / JSON / Parquet files through `datasets.load_dataset`.

    Without a `validation` file, `validation_fraction` of the training rows is held out (seeded). Relative paths
    are taken from the directory the command was run in.
    """
    check_fraction(validation_fraction)
    paths = {"train": train} if validation is None else {"train": train, "validation": validation}
    for split, path in paths.items():
        refuse_folder(split, path, f"a {'/'.join(FILE_FORMATS)}")
        if not Path(path).expanduser().is_file():
            raise DataError(
                f"data.{split}: no such file '{path}' (looked in {Path(path).expanduser().resolve().parent}); "
                f"give the path of a {'/'.join(FILE_FORMATS)} file, absolute or relative to where you ran the command"
            )
    format = format or Path(train).suffix.lstrip(".").lower()
    if format == "jsonl":
        format = "json"
    if format not in FILE_FORMATS:
        raise ConfigError("data.format", f"'{format}' is not a file format this reads; choose one of {', '.join(FILE_FORMATS)}")

    import datasets

    data_files = {split: str(Path(path).expanduser().resolve()) for split, path in paths.items()}
    if validation is not None:
        refuse_other_columns(data_files["train"], data_files["validation"], train, validation, format)
    loaded = read_files(format, data_files, paths)
    for split, dataset in loaded.items():
        check_table(dataset, f"data.{split}", paths[split], label_column, feature_columns)
    if "validation" not in loaded:
        held_out = loaded["train"].train_test_split(test_size=validation_fraction, seed=seed)
        loaded = datasets.DatasetDict({"train": held_out["train"], "validation": held_out["test"]})
    return to_classification(loaded, label_column, feature_columns)


def read_files(format: str, data_files: dict[str, Any], paths: dict[str, Any], **options):
    """`datasets.load_dataset(format, **options)` over the user's files (`data_files`: split -> resolved path, or a
    list of them; `paths`: as the user gave them). A file it cannot read is a DataError naming that file and why,
    instead of datasets' own traceback."""
    import datasets

    try:
        with _datasets_errors_held_back():
            return datasets.load_dataset(format, data_files=data_files, **options)
    except Exception:  # pandas / pyarrow / json parse / decoding errors: a file is not of this format
        raise unreadable(format, data_files, paths, **options) from None


def unreadable(format: str, data_files: dict[str, Any], paths: dict[str, Any], **options) -> DataError:
    """Which of the files datasets could not read as `format`, and its reader's reason: each is read alone again,
    as the message of a failure of several together names none."""
    import datasets

    tables = format in FILE_FORMATS
    for split, resolved in data_files.items():
        several = isinstance(resolved, (list, tuple))
        for path in resolved if several else [resolved]:
            name = path if several else paths[split]  # one file: as the user wrote it
            if tables and os.path.getsize(path) == 0:
                return DataError(f"data.{split}: {name} is empty; give a {format} file with a header and data rows")
            if format == "csv" and _lines(path) <= 1:
                return DataError(f"data.{split}: {name} has a header and no data rows; give one row per sample")
            try:
                with _datasets_errors_held_back():
                    datasets.load_dataset(format, data_files={split: path}, **options)
            except Exception as err:
                cause = err.__cause__ if isinstance(err, datasets.exceptions.DatasetGenerationError) else None
                reason = cause or err
                hint = (f"; it is not {options['encoding']} text: set data.encoding to its encoding"
                        if isinstance(reason, UnicodeDecodeError) and "encoding" in options else "")
                return DataError(f"data.{split}: cannot read {name} as {format}: {type(reason).__name__}: "
                                 f"{first_line(reason).rstrip('.')}{hint}")
    given = [str(paths[split]) for split in data_files]
    return DataError(f"data: cannot read {' and '.join(given)} together as {format}; each reads alone, so check that "
                     "they have the same columns and types")


@contextmanager
def _datasets_errors_held_back() -> Iterator[None]:
    """datasets' log held back while it reads the user's files: it logs a reader's error before raising it (a
    console showed it twice, through datasets' handler and the root logger's), and the runner reports that error
    itself, once, with the file's name."""
    from datasets.utils import logging as datasets_logging

    verbosity = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)


def header(path: str, format: str) -> list[str] | None:
    """The column names of a CSV or Parquet file, read from its header or schema alone (None for JSON, or a file
    that cannot be read: loading it says why)."""
    import csv

    try:
        if format == "csv":
            with open(path, newline="", encoding="utf-8-sig") as handle:  # -sig: a BOM is not part of a name
                return next(csv.reader(handle), None)
        if format == "parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(path).names
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):  # pyarrow's ArrowInvalid is a ValueError
        return None
    return None


def refuse_other_columns(train_file: str, validation_file: str, train: str, validation: str, format: str) -> None:
    """A validation file with other columns than the training file: named here (loaded together, datasets would
    fill a missing column with nulls, or fail its cast naming neither file)."""
    train_columns, validation_columns = header(train_file, format), header(validation_file, format)
    if train_columns is None or validation_columns is None or set(train_columns) == set(validation_columns):
        return
    missing = [column for column in train_columns if column not in validation_columns]
    extra = [column for column in validation_columns if column not in train_columns]
    differences = "; ".join(filter(None, [missing and f"it lacks {', '.join(missing)}",
                                          extra and f"it has {', '.join(extra)}, which {train} does not"]))
    raise DataError(f"data.validation: {validation} has other columns than data.train ({train}): {differences}; "
                    "give both files the same columns")


def check_fraction(validation_fraction: float) -> None:
    if not 0 < validation_fraction < 1:
        raise ConfigError("data.validation_fraction", f"is {validation_fraction}; the share of rows held out for "
                                                      "validation must be between 0 and 1 (e.g. 0.2)")


def _lines(path: str) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def check_table(dataset, key: str, source: str, label_column: str, feature_columns: Sequence[str] | None) -> None:
    """What a classifier cannot train on, named by column and row before anything is built from it: no rows, a
    non-numeric feature, an empty, NaN or infinite cell (or one float32 cannot hold), a single class. Rows count
    data rows from 1 (the header aside)."""
    import pyarrow.compute as pc

    if len(dataset) == 0:
        raise DataError(f"{key}: {source} has no data rows (a header at most); give a table with one row per sample")
    if label_column not in dataset.column_names:
        return  # to_classification names the key and lists the columns
    for column in _feature_columns(dataset.column_names, label_column, feature_columns):
        if column not in dataset.column_names:
            continue
        values = dataset.data.column(column)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py() + 1
            raise DataError(f"{key}: {source}, column '{column}', row {row} is empty or NaN; fill or drop such "
                            "rows, or leave the column out with data.feature_columns")
        if not _is_numeric(dataset.features[column]):
            bad = next(value for value in values.to_pylist() if not _parses_as_number(value))
            row = values.to_pylist().index(bad) + 1
            raise DataError(f"{key}: {source}, column '{column}' is not numeric (row {row} holds {bad!r}); features must "
                            "be numbers: list the numeric columns in data.feature_columns, or encode this one as numbers")
        as_float = values.cast("float64")
        nans = pc.is_nan(as_float)
        if pc.any(nans).as_py():
            row = pc.index(nans, True).as_py() + 1
            raise DataError(f"{key}: {source}, column '{column}', row {row} is NaN; fill or drop such rows")
        # inf, and what float32 (the features' type in the model) cannot hold: the first step's loss would be NaN,
        # blamed on the learning rate.
        beyond = pc.greater(pc.abs(as_float), FLOAT32_MAX)
        if pc.any(beyond).as_py():
            row = pc.index(beyond, True).as_py() + 1
            raise DataError(f"{key}: {source}, column '{column}', row {row} is {as_float[row - 1].as_py()!r}, beyond "
                            "what float32 holds (features become float32); fill or drop such rows, or rescale the "
                            "column")
    labels = dataset.data.column(label_column)
    if labels.null_count:
        row = pc.index(pc.is_null(labels), True).as_py() + 1
        raise DataError(f"{key}: {source}, label column '{label_column}', row {row} is empty; every row needs a label")
    if key == "data.train" and len(pc.unique(labels)) < 2:
        raise ConfigError("data.label_column", f"'{label_column}' holds a single class ({labels[0].as_py()!r}) in "
                                               f"{source}; a classifier needs rows of at least two classes")


def _feature_columns(columns: Sequence[str], label_column: str, feature_columns: Sequence[str] | None) -> list[str]:
    return list(feature_columns) if feature_columns else [c for c in columns if c != label_column]


def _is_numeric(feature) -> bool:
    return getattr(feature, "dtype", "") in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                             "uint64", "float16", "float32", "float64")


def _parses_as_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def sklearn_digits(validation_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's bundled copy of the UCI handwritten digits (1,797 8x8 images, 10 classes): no download."""
    check_fraction(validation_fraction)
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise DataError(
            "data: this recipe reads scikit-learn's bundled digits, and scikit-learn is not installed; "
            f"install it with {install_hint('digits')}"
        ) from err
    import datasets

    bunch = load_digits()
    table = datasets.Dataset.from_dict(
        {"features": (bunch.data / 16.0).astype("float32").tolist(), "label": bunch.target.tolist()},
        features=datasets.Features(
            {
                "features": datasets.Sequence(datasets.Value("float32"), length=bunch.data.shape[1]),
                "label": datasets.ClassLabel(names=[str(digit) for digit in range(10)]),
            }
        ),
    )
    split = table.train_test_split(test_size=validation_fraction, seed=seed)
    return datasets.DatasetDict({"train": split["train"], "validation": split["test"]})


def hub(
    name: str,
    config_name: str | None = None,
    train_split: str = "train",
    validation_split: str = "validation",
    label_column: str = "label",
    feature_columns: Sequence[str] | None = None,
    validation_fraction: float = 0.2,
    seed: int = 0,
    probe_timeout_s: float = 3.0,
):
    """A dataset from the Hugging Face Hub by name (needs network, or HF_HUB_OFFLINE=1 and a cached copy).

    Offline without HF_HUB_OFFLINE, `datasets` retries for a minute or more; we probe the Hub first and fail in
    seconds with what to do instead.
    """
    check_fraction(validation_fraction)
    if os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false", "False") and not os.environ.get("HF_DATASETS_OFFLINE"):
        unreachable = hub_unreachable(probe_timeout_s)
        if unreachable:
            raise DataError(
                f"data.name: cannot reach the Hugging Face Hub ({unreachable}) to load '{name}'. "
                "Go online, or set HF_HUB_OFFLINE=1 to use a copy already in your cache, "
                "or point the recipe at local files (data=local_files, data.train=PATH)"
            )
    import datasets

    try:
        loaded = datasets.load_dataset(name, config_name)
    except Exception as err:  # datasets raises many types here (offline, missing, auth); all mean "cannot load"
        raise DataError(f"data.name: could not load Hub dataset '{name}': {err}") from err
    check_table(loaded[train_split], "data.name", f"'{name}' ({train_split})", label_column, feature_columns)
    splits: dict[str, Any] = {"train": loaded[train_split]}
    if validation_split in loaded:
        splits["validation"] = loaded[validation_split]
    else:
        held_out = loaded[train_split].train_test_split(test_size=validation_fraction, seed=seed)
        splits = {"train": held_out["train"], "validation": held_out["test"]}
    return to_classification(datasets.DatasetDict(splits), label_column, feature_columns)


def to_classification(splits, label_column: str, feature_columns: Sequence[str] | None):
    """Pack the chosen numeric columns into one `features` list column and the label into `label` (int64)."""
    import datasets

    train = splits["train"]
    if label_column not in train.column_names:
        raise ConfigError(
            "data.label_column",
            f"'{label_column}' is not a column of the data; columns are {', '.join(train.column_names)}",
        )
    columns = _feature_columns(train.column_names, label_column, feature_columns)
    missing = [c for c in columns if c not in train.column_names]
    if missing:
        raise ConfigError(
            "data.feature_columns",
            f"{', '.join(missing)} not in the data; columns are {', '.join(train.column_names)}",
        )
    encode_labels, classes = _label_encoder(splits, label_column)

    def pack(batch):
        rows = len(batch[label_column])
        return {
            "features": [[float(batch[c][i]) for c in columns] for i in range(rows)],
            "label": encode_labels(batch[label_column]),
        }

    packed_features = datasets.Features(
        {
            "features": datasets.Sequence(datasets.Value("float32"), length=len(columns)),
            "label": classes,
        }
    )
    return splits.map(pack, batched=True, remove_columns=train.column_names, features=packed_features)


def _label_encoder(splits, label_column: str):
    """Labels -> class ids, and the ClassLabel that names them. Class names (strings) are numbered in sorted order
    over every split at once, so class k means the same thing in each; integer labels are their own ids (0 to the
    largest label in any split)."""
    import datasets
    import pyarrow.compute as pc

    def kind(table) -> str:
        feature = table.features[label_column]
        return "class names (text)" if _is_string(feature) else f"{feature.dtype} values"

    named = _is_string(splits["train"].features[label_column])
    for split, table in splits.items():
        if _is_string(table.features[label_column]) != named:
            raise DataError(f"data.{split}: its label column '{label_column}' holds {kind(table)}, and data.train's "
                            f"holds {kind(splits['train'])}; give every split the same kind of labels")
    trained = set(splits["train"].unique(label_column))
    for split, table in splits.items():
        unseen = sorted(set(table.unique(label_column)) - trained, key=str)
        if unseen:
            log.warning("data.%s holds label(s) the training split lacks, which the model cannot learn: %s", split,
                        ", ".join(map(repr, unseen[:10])) + (" ..." if len(unseen) > 10 else ""))
    if named:
        names = sorted(set().union(*(split.unique(label_column) for split in splits.values())))
        classes = datasets.ClassLabel(names=names)
        return classes.str2int, classes
    lowest = min(pc.min(split.data.column(label_column)).as_py() for split in splits.values())
    if lowest < 0 or not all(_is_integer(split.features[label_column]) for split in splits.values()):
        raise DataError(f"data.label_column: '{label_column}' must hold class names or class numbers 0, 1, 2, ... "
                        f"(it holds {lowest!r} or non-integers); encode the labels as such")
    highest = max(pc.max(split.data.column(label_column)).as_py() for split in splits.values())
    return (lambda labels: labels), datasets.ClassLabel(num_classes=int(highest) + 1)


def _is_integer(feature) -> bool:
    return getattr(feature, "dtype", "").startswith(("int", "uint", "bool"))  # a ClassLabel's dtype is int64


def _is_string(feature) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")
