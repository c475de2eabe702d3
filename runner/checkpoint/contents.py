"""Reading what a checkpoint holds, for the loop's Checkpointer (resume) and the Accelerator's load_state alike: the
state file weights-only (plain data; pickled code is refused and never runs), the weights with safetensors (no
pickle at all), each failure as one message naming the file and what to do."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model
from torch import nn

from runner.errors import CheckpointError, first_line


def load_plain_state(file: Path, caller: str, advice: str, *, mmap: bool = False,
                     refusal: type[CheckpointError] = CheckpointError) -> dict:
    """torch.load(weights_only=True) of `file`, on the CPU. `caller` starts the message ("resume", "load_state"),
    `advice` ends it; `refusal` is the error raised (ResumeRefused where resume=auto would meet the same file)."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as err:  # weights_only refuses what is not plain data (pickled code); a garbled file fails too
        raise refusal(f"{caller}: {file} cannot be loaded safely ({type(err).__name__}: {first_line(err)}); it was "
                      f"altered after it was written, or not written by the runner. {advice}") from None


def load_weights(file: Path, model: nn.Module, caller: str) -> None:
    """Every tensor of the safetensors `file` into `model`, which must have exactly those names and shapes."""
    try:
        missing, unexpected = load_model(model, str(file), strict=False)
    except Exception as err:  # a shape mismatch (RuntimeError), or a file safetensors cannot parse
        first = str(err).strip().splitlines()
        raise CheckpointError(f"{caller}: the weights in {file} do not fit this model: "
                              f"{' '.join(line.strip() for line in first[:3])}") from err
    if missing or unexpected:
        raise CheckpointError(f"{caller}: the weights in {file} do not fit this model: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}")
