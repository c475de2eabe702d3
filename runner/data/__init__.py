"""Dataset factories (each returns a datasets.DatasetDict with train and validation) and batch sources."""

from runner.data.batches import ArrowBatches, TensorBatches, make_batches
from runner.data.generated import digit_sequences
from runner.data.tabular import hub, local_files, sklearn_digits
from runner.data.text import text_files

__all__ = ["ArrowBatches", "TensorBatches", "make_batches", "digit_sequences", "hub", "local_files", "sklearn_digits",
           "text_files"]
