"""Accelerator.save_model (runner/checkpoint/model_dir.py): transformers' layout, whole or in shards, read back by
huggingface_hub; a later save replaces an earlier one only once it is complete, and bad arguments are refused.
Under FSDP on 2 processes: tests/accelerate/test_parallel.py."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import load_torch_model

from runner import Accelerator
from runner.errors import ConfigError, WriteError
from runner.models import GPT, MLP


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32)  # its head is tied to the embedding


def same_weights(one, other) -> bool:
    theirs = other.state_dict()
    return all(torch.equal(tensor, theirs[name]) for name, tensor in one.state_dict().items())


def test_small_model_is_one_safetensors_file(tmp_path):
    """A model that fits is one model.safetensors and loads back, tied weights and all."""
    accelerator = Accelerator("cpu")
    model = accelerator.prepare(tiny_gpt(0))
    accelerator.save_model(model, tmp_path / "out")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["model.safetensors"]
    loaded = tiny_gpt(1)
    load_torch_model(loaded, tmp_path / "out", strict=True)
    assert same_weights(loaded, model)
    assert loaded.head.weight is loaded.token_embedding.weight  # still one matrix after loading


def test_over_max_shard_size_it_is_sharded(tmp_path):
    """Over max_shard_size it is shards and an index, and a smaller save removes them."""
    accelerator = Accelerator("cpu")
    model = tiny_gpt(0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")  # the user's own files in the directory stay
    (out / "model.safetensors.backup").write_text("mine")
    accelerator.save_model(model, out, max_shard_size="20KB")
    shards = sorted(path.name for path in out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict()) and set(index["weight_map"].values()) == set(shards)
    biggest_tensor = max(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    assert all((out / name).stat().st_size <= max(20_000, biggest_tensor) + 10_000 for name in shards)  # + header
    loaded = tiny_gpt(1)
    load_torch_model(loaded, out, strict=True)
    assert same_weights(loaded, model)

    accelerator.save_model(tiny_gpt(2), out, max_shard_size=10**9)  # fits in one file: the shards are gone
    assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.safetensors",
                                                            "model.safetensors.backup"]
    load_torch_model(loaded, out, strict=True)
    assert same_weights(loaded, tiny_gpt(2))


def test_failed_save_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """A save that fails half way leaves the earlier one whole."""
    import safetensors.torch

    accelerator = Accelerator("cpu")
    out = tmp_path / "out"
    accelerator.save_model(tiny_gpt(0), out, max_shard_size="20KB")
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    real_save_file, calls = safetensors.torch.save_file, []

    def fails_on_the_third(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 3:
            raise RuntimeError("Error while serializing: No space left on device")
        real_save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", fails_on_the_third)
    with pytest.raises(WriteError, match=r"while writing the model's weights"):
        accelerator.save_model(tiny_gpt(1), out, max_shard_size="10KB")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # no partial file, nothing replaced


def test_bad_arguments_are_refused_before_writing(tmp_path):
    accelerator = Accelerator("cpu")
    with pytest.raises(ConfigError) as error:
        accelerator.save_model(MLP(4, 2), tmp_path / "out", max_shard_size="ten gigs")
    assert str(error.value).startswith("bad config: save_model(max_shard_size): is 'ten gigs' (")
    assert "give a number of bytes or a size such as '5GB', '500MB' or '100KB'" in str(error.value)
    with pytest.raises(ConfigError, match=r"save_model\(safe_serialization\): is False; the runner writes "
                                          r"safetensors only"):
        accelerator.save_model(MLP(4, 2), tmp_path / "out", safe_serialization=False)
    assert not (tmp_path / "out").exists()


def test_get_state_dict_is_unwrapped_cpu_weights():
    accelerator = Accelerator("cpu")
    model = MLP(4, 2, hidden=[3])
    weights = accelerator.get_state_dict(accelerator.prepare(model))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[name], tensor) for name, tensor in model.state_dict().items())
