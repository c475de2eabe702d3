"""Dataset factories (each returns a datasets.DatasetDict with train and validation) and batch sources.

Each name is imported on first use (PEP 562): `runner.Accelerator` reaches `runner.data.batches` only, and a
hand-written script on it should not pay for the image, table and text factories it never calls.
"""

from importlib import import_module

# Imported at once: the function shares its module's name, and importing a submodule (as Hydra's target lookup or
# the preflight check may, at any time) sets the package attribute to the module, which would then hide it.
from runner.data.text_classification import text_classification

_HOMES = {
    "ArrowBatches": "batches", "TensorBatches": "batches", "make_batches": "batches",
    "digit_sequences": "generated",
    "digits_images": "images", "image_folder": "images", "image_parquet": "images",
    "hub": "tabular", "local_files": "tabular", "sklearn_digits": "tabular",
    "text_files": "text",
}

__all__ = [*_HOMES, "text_classification"]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'runner.data' has no attribute {name!r}")
    value = getattr(import_module(f"runner.data.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
