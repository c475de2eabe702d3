"""Every random number generator a run draws from, captured and restored in a form `weights_only=True` loads.

numpy's global state is kept as its bit generator's dict with the key as a torch tensor (a numpy array would need
an unsafe global to unpickle); python's `random.getstate()` is a tuple of ints; torch's are uint8 tensors.
The batch order needs no state here: it is recomputed from `seed + epoch` and the position in the epoch.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng() -> dict:
    numpy_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        # Only when CUDA is already in use: get_rng_state_all() would otherwise initialise it.
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }
    return state


def restore_rng(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    saved = state["numpy"]
    np.random.set_state({
        "bit_generator": saved["bit_generator"],
        "state": {"key": saved["key"].numpy().astype(np.uint32), "pos": saved["pos"]},
        "has_gauss": saved["has_gauss"],
        "gauss": saved["gauss"],
    })
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value):
    """random.setstate wants (version, tuple_of_ints, gauss); a round trip may hand back lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(item) for item in value)
    return value
