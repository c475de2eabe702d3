"""Layer 0: the few small helpers every layer uses (imports nothing of the runner). One of each: flatten a nested
dict to dotted keys (and to TensorBoard's hparams), write a text file atomically, compare a monitored value by its mode."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Any


def flatten(tree: Any, prefix: str = "", *, empty_as_leaf: bool = False) -> dict[str, Any]:
    """Nested dicts as {"a.b.c": leaf}. An empty dict adds no key, unless `empty_as_leaf` (then it is the leaf)."""
    if not isinstance(tree, dict) or (empty_as_leaf and not tree):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}.", empty_as_leaf=empty_as_leaf))
    return flat


def flatten_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """Nested keys as dotted names; lists, None and other non-scalars as strings (TensorBoard refuses them)."""
    return {name: str(value.value) if isinstance(value, Enum) else value if isinstance(value, (bool, int, float, str))
            else str(value) for name, value in flatten(config, prefix).items()}

def write_text_atomically(path: Path, text: str, temporary: Path | None = None) -> None:
    """Write under `temporary` (by default a hidden name beside `path`), fsync, then rename into place: a reader
    never sees half a file. `temporary=path` writes in place (inside a directory that is itself renamed into place)."""
    temporary = temporary or path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if temporary != path:
            os.replace(temporary, path)
    except OSError:
        if temporary != path:
            temporary.unlink(missing_ok=True)
        raise


def better(value: float, than: float, mode: str) -> bool:
    """Whether `value` beats `than` for a monitor of this mode ("max", else smaller is better; a MonitorMode too)."""
    return value > than if mode == "max" else value < than
