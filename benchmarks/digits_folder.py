"""Write scikit-learn's bundled handwritten digits (1,797 8x8 greyscale images, no download) as PNG files, one
sub-folder per class: a folder of images like a user's own, for `recipe=image_folder`.

    python benchmarks/digits_folder.py digits_png
    python -m runner recipe=image_folder data.train=digits_png model.flip=false

Pixels 0..16 are scaled to 0..255 as `data=digits_images` scales them (runner/data/images.py). The files stay 8x8
and greyscale: the recipe decodes each once, as RGB resized to `data.image_size` (32), like any folder of photos.
Needs scikit-learn and Pillow (`pip install -e '.[digits,images]'`).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def write_digits(root: Path) -> int:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = (bunch.images * (255 / 16)).round().astype(np.uint8)
    for index, (image, label) in enumerate(zip(pixels, bunch.target)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, "L").save(folder / f"{index:04d}.png")
    return len(pixels)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("output", type=Path, help="a new or empty folder")
    args = parser.parse_args()
    if args.output.exists() and any(args.output.iterdir()):
        parser.error(f"{args.output} is not empty; give a new folder")
    count = write_digits(args.output)
    print(f"{args.output}: {count:,} PNGs in {len(list(args.output.iterdir()))} class folders")


if __name__ == "__main__":
    main()
