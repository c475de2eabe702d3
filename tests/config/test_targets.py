"""Every `_target_` users can copy (conf/, recipes/, README.md and docs/ code) resolves as Hydra resolves it, by
import: the public module paths recipes name stay where they are when modules move."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from hydra.utils import get_object

ROOT = Path(__file__).resolve().parents[2]
TARGET = re.compile(r"""_target_["']?\s*[:=]\s*["']?([A-Za-z_][A-Za-z0-9_.]*)""")


def _sources() -> list[Path]:
    found = sorted((ROOT / "conf").rglob("*.yaml")) + sorted((ROOT / "recipes").rglob("*.yaml"))
    found += [path for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if path.is_file()]
    return found


def _targets() -> list[tuple[str, str]]:
    seen = {}
    for path in _sources():
        for target in TARGET.findall(path.read_text(encoding="utf-8")):
            seen.setdefault(target, str(path.relative_to(ROOT)))
    return sorted(seen.items())


# The docs' examples of a user's own package: not ours to resolve. Any other top-level name must import.
USERS_OWN = "mylab"


def test_targets_found():
    assert any(target.startswith("runner.models.") for target, _ in _targets())


def test_only_the_docs_user_package_is_left_unresolved():
    unresolved = {target for target, _ in _targets() if importlib.util.find_spec(target.split(".")[0]) is None}
    assert {target.split(".")[0] for target in unresolved} <= {USERS_OWN}, unresolved


@pytest.mark.parametrize("target,source", [pair for pair in _targets() if pair[0].split(".")[0] != USERS_OWN])
def test_target_resolves(target, source):
    assert callable(get_object(target)), f"{source}: _target_ {target} is not callable"
