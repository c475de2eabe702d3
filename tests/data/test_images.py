"""The image path: a folder of PNGs (class per sub-folder), an image column in Parquet and the bundled digits,
each decoded once into uint8 `pixels`; and the batched preprocessing in the model's first layer (normalisation
always, random crop and flip only in training)."""

from __future__ import annotations

import importlib.util
import io
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import ROOT
from runner.data import digits_images, image_folder, image_parquet, make_batches
from runner.errors import ConfigError, DataError
from runner.models import ImagePreprocess, ResNet

PIL = pytest.importorskip("PIL.Image")

CLASSES = ("cat", "dog")  # imagefolder numbers the sub-folders in sorted order: cat 0, dog 1


def gradient_png(path, label: int, index: int, width: int = 16, height: int = 8) -> None:
    """Red = 10 x column, green = 100 + 5 x row, blue = 20 x index + label: every pixel says where it came from."""
    x, y = np.meshgrid(np.arange(width), np.arange(height))
    rgb = np.stack([10 * x, 100 + 5 * y, np.full_like(x, 20 * index + label)], axis=-1).astype(np.uint8)
    PIL.fromarray(rgb, "RGB").save(path)


def gradient_folder(root, per_class: int = 5):
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            gradient_png(root / name / f"{index}.png", label, index)
    return root


def planes(row, channels: int, size: int) -> np.ndarray:
    return np.asarray(row["pixels"], dtype=np.uint8).reshape(channels, size, size)


def test_image_folder_crops_centre_labels_by_folder(tmp_path):
    """Each PNG is decoded once to its centre square and labelled by its folder."""
    # 16 x 8 images and image_size 8: the height is already 8, so no resampling; the centre 8 columns (4..11) stay.
    splits = image_folder(str(gradient_folder(tmp_path / "images")), image_size=8, validation_fraction=0.4)
    assert splits["train"].column_names == ["pixels", "label"]
    assert splits["train"].features["pixels"].length == 3 * 8 * 8
    assert splits["train"].features["pixels"].feature.dtype == "uint8"
    # Held out per class (stratified): 2 of each class's 5 images validate, and no image is in both splits.
    assert Counter(splits["train"]["label"]) == {0: 3, 1: 3}
    assert Counter(splits["validation"]["label"]) == {0: 2, 1: 2}
    seen = []
    for split in ("train", "validation"):
        for row in splits[split]:
            red, green, blue = planes(row, 3, 8).astype(int)
            assert (red == 10 * np.arange(4, 12)).all()  # columns 4..11 of 0..15, on every row
            assert (green == (100 + 5 * np.arange(8))[:, None]).all()
            assert (blue == blue[0, 0]).all() and blue[0, 0] % 20 == row["label"]  # the label is the folder's
            seen.append(int(blue[0, 0]))
    assert sorted(seen) == sorted(20 * index + label for label in range(2) for index in range(5))


def test_image_folder_resizes_and_converts_to_grey(tmp_path):
    """The shorter side is resized to image_size, then the centre square is kept."""
    root = tmp_path / "images"
    for name, value in zip(CLASSES, (40, 200)):
        (root / name).mkdir(parents=True)
        for index in range(3):  # 20 x 10: scaled to 16 x 8, then the centre 8 x 8
            PIL.new("RGB", (20, 10), (value, value, value)).save(root / name / f"{index}.png")
    splits = image_folder(str(root), image_size=8, channels=1, validation=str(root))
    assert splits["validation"].features["pixels"].length == 8 * 8
    for row in splits["validation"]:
        assert (planes(row, 1, 8) == (40, 200)[row["label"]]).all()  # a flat image stays flat through the resize


def test_image_folder_names_what_is_wrong(tmp_path):
    with pytest.raises(DataError, match="data.train: no such folder 'missing'"):
        image_folder("missing", image_size=8)
    flat = tmp_path / "flat"
    flat.mkdir()
    for index in range(4):
        gradient_png(flat / f"{index}.png", 0, index)
    with pytest.raises(DataError, match=r"data.train: the images in '.*flat' are not in class sub-folders"):
        image_folder(str(flat), image_size=8)
    train = gradient_folder(tmp_path / "train", per_class=2)
    other = tmp_path / "other"
    for name in ("cat", "cow"):
        (other / name).mkdir(parents=True)
        gradient_png(other / name / "0.png", 0, 0)
    with pytest.raises(DataError, match=r"data.validation: its class folders \['cat', 'cow'\] differ from "
                                        r"data.train's \['cat', 'dog'\]"):
        image_folder(str(train), image_size=8, validation=str(other))
    with pytest.raises(ConfigError, match="data.channels: is 2; it must be 1 .grey. or 3 .RGB."):
        image_folder(str(train), image_size=8, channels=2, validation=str(train))


def _png_bytes(rgb: tuple[int, int, int], size=(6, 6)) -> bytes:
    out = io.BytesIO()
    PIL.new("RGB", size, rgb).save(out, format="PNG")
    return out.getvalue()


def test_image_parquet_reads_images_and_class_names(tmp_path):
    import datasets

    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (10, 20, 30)]
    table = datasets.Dataset.from_dict(
        {"img": [PIL.new("RGB", (6, 6), colour) for colour in colours], "kind": ["b", "a", "b", "a"]},
        features=datasets.Features({"img": datasets.Image(), "kind": datasets.Value("string")}),
    )
    path = tmp_path / "images.parquet"
    table.to_parquet(str(path))
    splits = image_parquet(str(path), image_size=4, validation=str(path), image_column="img", label_column="kind")
    rows = list(splits["validation"])  # the same file validates: row order kept
    assert [row["label"] for row in rows] == [1, 0, 1, 0]  # names sorted: a 0, b 1
    for row, colour in zip(rows, colours):
        assert (planes(row, 3, 4) == np.asarray(colour, dtype=np.uint8)[:, None, None]).all()
    with pytest.raises(ConfigError, match="data.image_column: 'image' is not a column of the data; columns are img, kind"):
        image_parquet(str(path), image_size=4)


def test_image_parquet_decodes_a_plain_bytes_column(tmp_path):
    """Encoded PNG bytes without datasets' Image metadata (as pandas writes them) are cast to images."""
    import pandas as pd

    frame = pd.DataFrame({"image": [_png_bytes((value, value, value)) for value in (0, 50, 100, 150, 200)],
                          "label": [0, 1, 0, 1, 0]})
    path = tmp_path / "bytes.parquet"
    frame.to_parquet(path)
    splits = image_parquet(str(path), image_size=3, channels=1, validation=str(path))
    assert splits["validation"]["label"] == [0, 1, 0, 1, 0]
    assert [set(row["pixels"]) for row in splits["validation"]] == [{0}, {50}, {100}, {150}, {200}]


def test_digits_images_are_bundled_digits_as_bytes():
    """The bundled digits, 0..16 scaled to 0..255."""
    from sklearn.datasets import load_digits

    splits = digits_images(validation_fraction=0.2, seed=0)
    assert (len(splits["train"]), len(splits["validation"])) == (1437, 360)
    assert splits["train"].features["pixels"].length == 64
    bunch = load_digits()
    expected = Counter(zip(map(tuple, (bunch.data * 255 / 16).round().astype(np.uint8).tolist()), bunch.target.tolist()))
    assert every_row(splits) == expected  # every digit once, 0..16 scaled to 0..255
    # In memory or streamed from Arrow (a split over trainer.data_in_memory_mb), the same rows and values.
    batches = make_batches(splits["train"], 32, True, 0, in_memory_limit_mb=64)
    in_memory = next(iter(batches))
    streamed = next(iter(make_batches(splits["train"], 32, True, 0, in_memory_limit_mb=0)))
    assert in_memory["pixels"].shape == streamed["pixels"].shape == (32, 64) and streamed["pixels"].dtype == torch.uint8
    assert torch.equal(in_memory["pixels"].long(), streamed["pixels"].long())
    first = splits["train"][int(batches._order()[0])]
    assert in_memory["pixels"][0].tolist() == first["pixels"] and in_memory["label"][0] == first["label"]
    model = ResNet(num_classes=10, channels=1, image_size=8, widths=[8]).eval()
    assert model(streamed["pixels"]).shape == model(in_memory["pixels"]).shape == (32, 10)


def test_digits_png_folder_reads_back_unchanged(tmp_path):
    """benchmarks/digits_folder.py (the README's image_folder data) loses nothing: through imagefolder the PNGs
    give exactly the pixels and labels of data=digits_images."""
    spec = importlib.util.spec_from_file_location("digits_folder", ROOT / "benchmarks" / "digits_folder.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.write_digits(tmp_path / "digits") == 1797
    assert sorted(path.name for path in (tmp_path / "digits").iterdir()) == [str(digit) for digit in range(10)]
    from_folder = image_folder(str(tmp_path / "digits"), image_size=8, channels=1)
    bundled = digits_images()

    assert every_row(from_folder) == every_row(bundled)


def every_row(splits) -> Counter:
    """(pixels, label) of every row of every split, as a multiset: a hold-out reorders rows, never changes them."""
    columns = [split.with_format("numpy")[:] for split in splits.values()]
    return Counter((tuple(pixels), label) for table in columns
                   for pixels, label in zip(table["pixels"].tolist(), table["label"].tolist()))


MEAN, STD = (0.1, 0.2, 0.3), (0.5, 0.25, 0.2)


def _pixels(batch: int = 64, channels: int = 3, size: int = 4) -> torch.Tensor:
    return torch.randint(0, 256, (batch, channels * size * size), generator=torch.Generator().manual_seed(0),
                         dtype=torch.int64).to(torch.uint8)


def _normalised(images: torch.Tensor) -> torch.Tensor:
    return (images / 255.0 - torch.tensor(MEAN).view(-1, 1, 1)) / torch.tensor(STD).view(-1, 1, 1)


def test_eval_preprocess_only_normalises():
    """In eval mode the preprocessing only normalises, and is deterministic."""
    pixels = _pixels()
    layer = ImagePreprocess(3, 4, MEAN, STD, crop_padding=1, flip=True).eval()
    out = layer(pixels)
    assert out.shape == (64, 3, 4, 4) and out.dtype == torch.float32
    torch.testing.assert_close(out, _normalised(pixels.view(64, 3, 4, 4).float()))
    assert torch.equal(layer(pixels), out)
    grey = ImagePreprocess(1, 2, [0.5], [0.25]).eval()
    assert grey(torch.tensor([[0, 255, 51, 204]], dtype=torch.uint8)).flatten().tolist() == \
        pytest.approx([-2.0, 2.0, -1.2, 1.2])
    # Without crop and flip, training changes nothing either.
    plain = ImagePreprocess(3, 4, MEAN, STD, crop_padding=0, flip=False).train()
    torch.testing.assert_close(plain(pixels), out)


def test_train_preprocess_crops_and_flips_per_image():
    """In training each image is cropped at its own offset, and about half are flipped."""
    pixels = _pixels()
    images = pixels.view(64, 3, 4, 4).float()
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1))  # zero padding: those pixels normalise to -mean/std
    layer = ImagePreprocess(3, 4, MEAN, STD, crop_padding=1, flip=True).train()
    torch.manual_seed(1)
    out = layer(pixels)
    torch.manual_seed(1)
    assert torch.equal(layer(pixels), out)  # the draws come from torch's RNG: a seeded (or resumed) run repeats
    choices = []
    for index in range(64):
        matches = [(top, left, flipped) for top in range(3) for left in range(3) for flipped in (False, True)
                   if torch.allclose(out[index], _normalised(_crop(padded[index], top, left, flipped)))]
        assert len(matches) == 1, f"image {index} is not one crop of its padded self: {matches}"
        choices.append(matches[0])
    offsets, flips = Counter(c[:2] for c in choices), Counter(c[2] for c in choices)
    assert len(offsets) >= 5 and set(flips) == {False, True}  # 9 offsets, 2 flips, drawn per image
    assert 16 <= flips[True] <= 48


def _crop(image: torch.Tensor, top: int, left: int, flipped: bool) -> torch.Tensor:
    square = image[:, top : top + 4, left : left + 4]
    return square.flip(-1) if flipped else square


def test_preprocess_flip_alone_mirrors_whole_images():
    pixels = _pixels(batch=40)
    layer = ImagePreprocess(3, 4, MEAN, STD, flip=True).train()
    torch.manual_seed(2)
    out = layer(pixels)
    expected = _normalised(pixels.view(40, 3, 4, 4).float())
    same = [torch.allclose(o, e) for o, e in zip(out, expected)]
    mirrored = [torch.allclose(o, e.flip(-1)) for o, e in zip(out, expected)]
    assert all(s != m for s, m in zip(same, mirrored)) and any(same) and any(mirrored)


def test_preprocess_names_a_bad_mean_or_std():
    with pytest.raises(ConfigError, match=r"model.mean: has 2 values; give 1 or one per channel \(3\)"):
        ImagePreprocess(3, 4, [0.1, 0.2], [0.5])
    with pytest.raises(ConfigError, match=r"model.std: has 2 values"):
        ResNet(num_classes=2, channels=3, std=[0.5, 0.5])
