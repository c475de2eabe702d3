"""Layer 0: the few small helpers every layer uses (imports nothing of the runner). One of each: flatten a nested
dict to dotted keys (and to TensorBoard's hparams), write a text file atomically, compare a monitored value by its mode,
and say how to install an optional extra."""

from __future__ import annotations

import os
import re
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


# The distribution's name on the package index. `runner` there is an unrelated project (a 2013 command runner), so a
# hint naming `runner[wandb]` would make pip install someone else's code; the import package stays `runner`.
DISTRIBUTION = "runner-ml"


def extra_requirements(extra: str) -> list[str]:
    """The requirements declared for one optional extra ("digits" -> ["scikit-learn>=1.3"]): from the installed
    distribution's metadata (a wheel's or an editable install's), else from the source tree's pyproject.toml."""
    from importlib import metadata

    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return _extras_in_source_tree().get(extra, [])
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return [requirement.split(";")[0].strip() for requirement in declared
            if ";" in requirement and marker.search(requirement.split(";", 1)[1])]


def _extras_in_source_tree() -> dict[str, list[str]]:
    """pyproject.toml's optional dependencies, for a checkout run without installing it (PYTHONPATH=<checkout>)."""
    try:
        import tomllib  # Python 3.11+

        pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    except (ImportError, OSError, ValueError):
        return {}
    return pyproject.get("project", {}).get("optional-dependencies", {})


def install_hint(extra: str) -> str:
    """A pip command that installs an optional extra from whatever folder the user is in: the extra's own packages
    (`pip install -e '.[digits]'` works only inside the checkout, and `runner-ml[digits]` only once the distribution
    is on the index), naming the extra for those who install the distribution itself."""
    packages = " ".join(f"'{requirement}'" for requirement in extra_requirements(extra))
    if not packages:  # neither installed nor a checkout: the name on the index is all there is to say
        return f"pip install '{DISTRIBUTION}[{extra}]'"
    return f"pip install {packages} (the '{extra}' extra of {DISTRIBUTION})"
