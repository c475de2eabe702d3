"""Accelerator.load_state reads a save_state directory through the same reader as the loop's resume
(runner/checkpoint/contents.py): a state file holding code is refused, named, and nothing runs; weights that do not
fit the prepared model are named with the file."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from runner import Accelerator
from runner.errors import CheckpointError

from checkpoint_helpers import TouchesAFile, reseal


def _saved(tmp_path, width: int = 4):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(width, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    directory = tmp_path / "state"
    accelerator.save_state(directory)
    return accelerator, directory


def test_state_file_with_code_is_refused_unrun(tmp_path):
    accelerator, directory = _saved(tmp_path)
    marker = tmp_path / "ran"
    (directory / "state.pt").write_bytes(pickle.dumps({"schedulers": [TouchesAFile(marker)]}))
    reseal(directory)  # the hashes match again: only the reader stands between the file and the code
    with pytest.raises(CheckpointError, match=rf"load_state: {directory / 'state.pt'} cannot be loaded safely "
                                              r"\(UnpicklingError: .*\); it was altered after it was written, or not "
                                              r"written by the runner. Load another directory written by save_state"):
        accelerator.load_state(directory)
    assert not marker.exists()


def test_weights_that_do_not_fit_are_named(tmp_path):
    _, directory = _saved(tmp_path, width=4)
    other = Accelerator(cpu=True)
    model = other.prepare(nn.Linear(8, 2))
    other.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match=rf"load_state: the weights in {directory / 'model_0.safetensors'} do "
                                              r"not fit this model: .*size"):
        other.load_state(directory)
