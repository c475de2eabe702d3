"""The one Hub reachability probe (runner/hub.py) and the two paths that use it: Hub datasets and transformers
names. Offline here: a closed local port stands in for an unreachable Hub, so each failure takes milliseconds."""

from __future__ import annotations

import socket

import pytest

from runner.errors import ConfigError, DataError
from runner.hub import hub_unreachable

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens on it here, so a connect is refused at once


@pytest.fixture
def unreachable_hub(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", CLOSED)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)


def test_probe_names_the_unreachable_host_and_port(unreachable_hub, monkeypatch):
    reason = hub_unreachable(timeout_s=1.0)
    assert reason is not None and reason.startswith("127.0.0.1:9: ")
    with socket.socket() as listening:  # a host that accepts the connection counts as reachable
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert hub_unreachable(timeout_s=1.0) is None


def test_hub_dataset_fails_naming_key_and_ways_out(unreachable_hub):
    from runner.data import hub

    with pytest.raises(DataError) as caught:
        hub("imdb", probe_timeout_s=1.0)
    message = str(caught.value)
    assert message.startswith("data.name: cannot reach the Hugging Face Hub (127.0.0.1:9: ")
    assert "to load 'imdb'" in message and "HF_HUB_OFFLINE=1" in message and "data=local_files" in message


def test_an_uncached_model_names_model_and_cache(unreachable_hub, monkeypatch):
    """A transformers model name not in the cache, the Hub unreachable: the error names the model and the cache."""
    pytest.importorskip("transformers")
    from huggingface_hub import constants

    from runner.models import from_pretrained

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read once at import: the probe decides
    with pytest.raises(ConfigError) as caught:
        from_pretrained("nobody/no-such-model")
    message = str(caught.value)
    assert message.startswith("bad config: model.name: 'nobody/no-such-model' is not a local directory and not in "
                              f"the Hugging Face cache ({constants.HF_HUB_CACHE})")
    assert "the Hub cannot be used (127.0.0.1:9: " in message and "hf download nobody/no-such-model" in message
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"the Hub cannot be used \(HF_HUB_OFFLINE is set\)"):
        from_pretrained("nobody/no-such-model")


def test_an_offline_tokenizer_is_not_blamed_on_the_recipe(unreachable_hub, monkeypatch, tmp_path, capsys):
    """recipe=gpt tokenizer=pretrained goes together (docs/data-models.md); that the tokenizer is not in this
    machine's cache is the only problem to report, not "recipe=gpt and tokenizer=pretrained do not go together"."""
    pytest.importorskip("transformers")
    from huggingface_hub import constants

    from conftest import run_in_process

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    (tmp_path / "input.txt").write_text("to be or not to be\n" * 50)
    result = run_in_process("recipe=gpt", "tokenizer=pretrained", "data.tokenizer.name=nobody/no-such-tokenizer",
                            "data.train=input.txt", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, capsys=capsys)
    assert result.returncode == 1, result.output
    assert "runner: error: bad config: data.tokenizer.name: 'nobody/no-such-tokenizer' is not a local directory" \
        in result.stderr
    assert "do not go together" not in result.output
