"""Dataset factories (each returns a datasets.DatasetDict with train and validation) and batch sources."""

from runner.data.batches import ArrowBatches, TensorBatches, make_batches
from runner.data.generated import digit_sequences
from runner.data.images import digits_images, image_folder, image_parquet
from runner.data.tabular import hub, local_files, sklearn_digits
from runner.data.text import text_files
from runner.data.text_classification import text_classification

__all__ = ["ArrowBatches", "TensorBatches", "make_batches", "digit_sequences", "hub", "local_files", "sklearn_digits",
           "text_files", "digits_images", "image_folder", "image_parquet", "text_classification"]
