"""Small data for the tests: a text corpus, and the small files for composing every recipe with every config-group option (tests/run/test_recipe_matrix.py): the data each
data group reads, written once, plus the overrides that make each run tiny. tests/golden.py trains every recipe on
these same files: a change here moves the golden losses (re-record them: python tests/golden.py --record)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ["the cat", "a dog", "my bird", "the fish"]
VERBS = ["sat on", "ran to", "looked at"]


def corpus(lines: int, seed: int = 0) -> str:
    """A text of short sentences from a few words, for the tokenizer and language-model tests."""
    rng = random.Random(seed)
    return "".join(f"{rng.choice(WORDS)} {rng.choice(VERBS)} {rng.choice(WORDS)}.\n" for _ in range(lines))


def write(folder: Path) -> dict[str, Path]:
    """A text corpus, a table of numbers, a table of texts, a folder of PNGs and a parquet of images."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    words = ["the", "king", "queen", "sword", "crown", "night", "day", "speaks", "to", "of"]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)) + "\n")
    table = folder / "table.csv"
    rows = ["a,b,c,d,label"] + [",".join(f"{rng.gauss(i % 3, 0.3):.3f}" for _ in range(4)) + f",{i % 3}"
                                for i in range(90)]
    table.write_text("\n".join(rows) + "\n")
    texts = folder / "texts.csv"
    lines = ["text,label"] + [f"{' '.join(rng.choice(words) for _ in range(8))},{i % 2}" for i in range(80)]
    texts.write_text("\n".join(lines) + "\n")
    images = folder / "images"
    parquet = folder / "images.parquet"
    try:
        from PIL import Image

        for label in ("dark", "light"):
            (images / label).mkdir(parents=True, exist_ok=True)
            for index in range(6):
                shade = 40 if label == "dark" else 210
                Image.new("RGB", (10, 12), (shade + index, shade, shade)).save(images / label / f"{index}.png")
        import datasets

        datasets.load_dataset("imagefolder", data_dir=str(images))["train"].to_parquet(str(parquet))
    except ImportError:
        pass
    return {"text_files": corpus, "local_files": table, "text_classification": texts, "image_folder": images,
            "image_parquet": parquet}


# The data group each recipe uses, and what every data group needs to run small.
def data_overrides(data: str, files: dict[str, Path]) -> list[str]:
    return {
        "reverse_digits": ["data.num_train=64", "data.num_validation=32"],
        "text_files": [f"data.train={files['text_files']}"],
        "local_files": [f"data.train={files['local_files']}"],
        "text_classification": [f"data.train={files['text_classification']}"],
        "image_folder": [f"data.train={files['image_folder']}"],
        "image_parquet": [f"data.train={files['image_parquet']}"],
    }.get(data, [])


RECIPE_DATA = {"reverse": "reverse_digits", "digits_mlp": "sklearn_digits", "tabular_csv": "local_files",
               "gpt": "text_files", "gpt2_hf": "text_files", "image_folder": "image_folder",
               "digits_cnn": "digits_images", "text_classification": "text_classification"}


def overrides(recipe: str, group: str, option: str, files: dict[str, Path]) -> list[str]:
    data = option if group == "data" else RECIPE_DATA[recipe]
    return [*data_overrides(data, files), "trainer.progress_bar=false"]
