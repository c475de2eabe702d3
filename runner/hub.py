"""Loading `transformers` objects by Hub name: from the local cache when it has them, else from the Hub, and
offline a failure in seconds that names the model and the cache to fill (instead of minutes of retries)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from runner.errors import ConfigError, Problem
from runner.ground import install_hint


def load_pretrained(loader: str, name: str, key: str, **kwargs):
    """`transformers.<loader>.from_pretrained(name, **kwargs)`; `key` is the config key that named it."""
    transformers = import_transformers(key)
    cls = getattr(transformers, loader)
    try:
        return cls.from_pretrained(name, local_files_only=True, **kwargs)  # a local dir, or already cached
    except (OSError, ValueError):
        pass
    from huggingface_hub import constants

    reason = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else hub_unreachable()
    if reason:
        raise ConfigError(Problem(
            key,
            f"'{name}' is not a local directory and not in the Hugging Face cache ({constants.HF_HUB_CACHE}), and "
            f"the Hub cannot be used ({reason}). Fill the cache on a machine that is online (`hf download {name}`) "
            f"and copy it here (or set HF_HUB_CACHE to it), or give the path of a directory holding its files",
            of_this_machine=True))
    return cls.from_pretrained(name, **kwargs)


def import_transformers(key: str):
    try:
        import transformers
    except ImportError as err:
        raise ConfigError(Problem(key, f"needs HuggingFace transformers: {install_hint('transformers')}",
                                  of_this_machine=True)) from err
    return transformers


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hub's host (HF_ENDPOINT, else huggingface.co) cannot be reached (one TCP connect, `timeout_s` at
    most), or None when it can. The one probe behind both Hub paths: `transformers` names here and Hub datasets
    (runner/data/tabular.py), so that neither spends minutes in its library's retries offline."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or 443
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return f"{host}:{port}: {err}"
    return None
