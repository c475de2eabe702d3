"""Image classification data: a folder of images with one sub-folder per class, Parquet files with an image column,
or scikit-learn's bundled digits (offline).

Images are decoded and resized **once**, in a batched `datasets.map` whose result is cached under HF_DATASETS_CACHE:
each split becomes two columns, `pixels` (uint8, channels x size x size, flattened) and `label` (int64). The loop then
draws batches of those like any other columns (in memory when the split fits `trainer.data_in_memory_mb`, else
streamed from the Arrow file), and the per-batch work (normalising, random crop and flip for training) runs batched on
the device in the model's first layer (runner.models.ImagePreprocess), never per sample in Python.
Reading image files needs Pillow (the `images` extra).
"""

from __future__ import annotations

from pathlib import Path

from runner.data.tabular import read_files, refuse_folder
from runner.errors import ConfigError, DataError
from runner.ground import install_hint

MODES = {1: "L", 3: "RGB"}


def image_folder(train: str, image_size: int, channels: int = 3, validation: str | None = None,
                 validation_fraction: float = 0.2, seed: int = 0):
    """`datasets.load_dataset("imagefolder")` over `train` (class = sub-folder name); `validation`: another such
    folder with the same classes, else `validation_fraction` of the images is held out (stratified by class)."""
    import datasets

    folders = {"train": train} if validation is None else {"train": train, "validation": validation}
    loaded = {}
    for split, folder in folders.items():
        if not Path(folder).expanduser().is_dir():
            raise DataError(f"data.{split}: no such folder '{folder}'; give a folder holding one sub-folder of "
                            "images per class, absolute or relative to where you ran the command")
        loaded[split] = datasets.load_dataset("imagefolder", data_dir=str(Path(folder).expanduser().resolve()),
                                              split="train")
    if "label" not in loaded["train"].features:
        raise DataError(f"data.train: the images in '{train}' are not in class sub-folders (folder/<class>/<image>)")
    names = loaded["train"].features["label"].names
    if validation is not None and loaded["validation"].features["label"].names != names:
        raise DataError(f"data.validation: its class folders {loaded['validation'].features['label'].names} differ "
                        f"from data.train's {names}")
    splits = _hold_out(loaded, validation_fraction, seed, stratify=True)
    return decode_images(splits, "image", "label", image_size, channels)


def image_parquet(train: str, image_size: int, channels: int = 3, validation: str | None = None,
                  image_column: str = "image", label_column: str = "label", validation_fraction: float = 0.2,
                  seed: int = 0):
    """Parquet files with an image column (a datasets Image feature, or {bytes, path} structs / encoded bytes,
    e.g. from `Dataset.to_parquet`) and a label column (class ids or names)."""
    import datasets

    from runner.data.tabular import _label_encoder

    paths = {"train": train} if validation is None else {"train": train, "validation": validation}
    for split, path in paths.items():
        refuse_folder(split, path, "a .parquet")
        if not Path(path).expanduser().is_file():
            raise DataError(f"data.{split}: no such file '{path}'; give the path of a .parquet file")
    loaded = read_files("parquet", {split: str(Path(path).expanduser().resolve()) for split, path in paths.items()},
                        paths)
    for key, column in (("data.image_column", image_column), ("data.label_column", label_column)):
        if column not in loaded["train"].column_names:
            raise ConfigError(key, f"'{column}' is not a column of the data; columns are "
                              f"{', '.join(loaded['train'].column_names)}")
    if not isinstance(loaded["train"].features[image_column], datasets.Image):
        loaded = loaded.cast_column(image_column, datasets.Image())
    encode, classes = _label_encoder(loaded, label_column)
    loaded = loaded.map(lambda batch: {label_column: encode(batch[label_column])}, batched=True)
    loaded = loaded.cast_column(label_column, classes)
    splits = _hold_out(dict(loaded), validation_fraction, seed, stratify=False)
    return decode_images(splits, image_column, label_column, image_size, channels)


def digits_images(validation_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's bundled 8x8 handwritten digits as 1-channel images (pixels 0..16 scaled to 0..255)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise DataError("data: the digits come with scikit-learn, which is not installed; "
                        f"{install_hint('digits')}") from err
    import datasets

    bunch = load_digits()
    table = datasets.Dataset.from_dict(
        {"pixels": (bunch.data * (255 / 16)).round().astype("uint8"), "label": bunch.target.astype("int64")},
        features=_features(1, 8, datasets.ClassLabel(names=[str(digit) for digit in range(10)])),
    )
    split = table.train_test_split(test_size=validation_fraction, seed=seed)
    return datasets.DatasetDict({"train": split["train"], "validation": split["test"]})


def _hold_out(splits: dict, fraction: float, seed: int, stratify: bool):
    import datasets

    if "validation" in splits:
        return datasets.DatasetDict(splits)
    if not 0 < fraction < 1:
        raise ConfigError("data.validation_fraction", f"is {fraction}; it must lie between 0 and 1 (exclusive)")
    held_out = splits["train"].train_test_split(test_size=fraction, seed=seed,
                                                stratify_by_column="label" if stratify else None)
    return datasets.DatasetDict({"train": held_out["train"], "validation": held_out["test"]})


def _features(channels: int, size: int, classes):
    """Flattened uint8 pixels and the label, a ClassLabel (class count and names: what fills model.num_classes)."""
    import datasets

    return datasets.Features({"pixels": datasets.Sequence(datasets.Value("uint8"), length=channels * size * size),
                              "label": classes})


def decode_images(splits, image_column: str, label_column: str, image_size: int, channels: int):
    """Every image decoded, converted to `channels`, resized (shorter side to `image_size`, then the centre
    square) and flattened to uint8: once per split, cached by datasets."""
    if channels not in MODES:
        raise ConfigError("data.channels", f"is {channels}; it must be 1 (grey) or 3 (RGB)")
    if image_size < 1:
        raise ConfigError("data.image_size", f"is {image_size}; it must be 1 or more")
    return splits.map(
        _decode_batch, batched=True, batch_size=256, remove_columns=splits["train"].column_names,
        features=_features(channels, image_size, _classes(splits["train"].features[label_column])),
        fn_kwargs={"image_column": image_column, "label_column": label_column, "size": image_size,
                   "mode": MODES[channels]},
    )


def _classes(feature):
    import datasets

    return feature if isinstance(feature, datasets.ClassLabel) else datasets.Value("int64")


def _decode_batch(batch, image_column: str, label_column: str, size: int, mode: str):
    import numpy as np
    import torch

    pixels = []
    for image in batch[image_column]:
        array = np.array(image.convert(mode), dtype=np.uint8)  # a writable copy: torch.from_numpy warns on read-only PIL buffers
        pixels.append(resize_square(torch.from_numpy(array.reshape(array.shape[0], array.shape[1], -1)), size))
    return {"pixels": torch.stack(pixels).flatten(1).numpy(), "label": batch[label_column]}


def resize_square(image, size: int):
    """(height, width, channels) uint8 -> (channels, size, size) uint8: the shorter side scaled to `size`
    (bilinear, antialiased), then the centre square cut out."""
    import torch
    import torch.nn.functional as F

    height, width = image.shape[:2]
    scale = size / min(height, width)
    new_h, new_w = max(size, round(height * scale)), max(size, round(width * scale))
    x = image.permute(2, 0, 1).unsqueeze(0).float()
    if (new_h, new_w) != (height, width):
        x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return x[0, :, top : top + size, left : left + size].round().clamp(0, 255).to(torch.uint8)
