"""The recipe's keys under a config group the command line swapped, and where a group's default came from: read
from the config files on Hydra's search path (plain YAML, no Hydra)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional


# A group swapped on the command line: the recipe's keys for it were written for the recipe's own choice.


MACHINE = "this machine's defaults (local/machine.yaml)"
"""The `source` of a swap that drops the machine file's keys (runner/commands/machine.py writes the file)."""


@dataclass(frozen=True)
class GroupSwap:
    """A config group set to something other than what a file of keys for it chose: the recipe, whose choice the
    command line replaced, or this machine's defaults, whose choice the recipe or the command line replaced."""

    group: str
    recipe_choice: Optional[str]
    """The choice the dropped keys were written for (the recipe's or the machine file's)."""
    chosen: Optional[str]
    dropped: List[str]
    """The file's keys under the group that were removed (or set back to the chosen option's own value)."""
    source: Optional[str] = None
    """Whose keys: None for the recipe, MACHINE for the machine file."""
    by: str = "on the command line"

    def describe(self, recipe: str) -> str:
        owner = f"recipe {recipe}" if self.source is None else self.source
        if self.recipe_choice is None:  # `override /model: null`: the recipe wrote its whole node itself
            replaced, written = f"{owner}'s own {self.group}", ""
        else:
            replaced, written = f"the {self.recipe_choice} of {owner}", f" (written for {self.recipe_choice})"
        return (f"{self.group}={self.chosen} {self.by} replaces {replaced}: its {', '.join(self.dropped)}"
                f"{written} {'is' if len(self.dropped) == 1 else 'are'} dropped")


def drop_swapped_group_keys(cfg: Any, choices: Dict[str, Any], overrides: List[str], config_dirs: List[str],
                            config_name: str = "config") -> List[GroupSwap]:
    """Remove from `cfg` (in place) the keys a file set for its own choice of a group that ended up another option.

    A recipe written for the warmup_cosine schedule sets scheduler.warmup_steps; `scheduler=none` asks for a
    constant learning rate, and that key would be left over on a null node, meaning nothing. The same holds for
    any group: keys the recipe set for its own choice are dropped, those the chosen option sets itself come back
    to its value, and keys set on the command line (scheduler.warmup_steps=5) are kept. The machine file's keys
    (`machine set hardware=multi_cpu hardware.num_processes=2`) go the same way when the recipe or the command line
    chose another option (hardware=cpu), except those the recipe sets itself."""
    recipe = choices.get("recipe")
    recipe_file = _find_config(config_dirs, "recipe", recipe)
    recipe_body, recipe_choices = _read_config(recipe_file) if recipe_file is not None else ({}, {})
    swaps = []
    machine_file = _find_config(config_dirs, "local", "machine")
    if machine_file is not None:
        machine_body, machine_choices = _read_config(machine_file)
        swapped = _groups_chosen_on_command_line(overrides)
        for group, machine_choice in machine_choices.items():
            kept = [f"{group}.{key}" for key in recipe_body.get(group) or {}] if isinstance(
                recipe_body.get(group), dict) else []
            by = "on the command line" if group in swapped else f"of recipe {recipe}"
            swaps += _drop(cfg, group, machine_body.get(group), machine_choice, choices.get(group), overrides + kept,
                           config_dirs, MACHINE, by)
    if recipe_file is None:
        return swaps
    primary = _find_config(config_dirs, None, config_name)
    default_choices = _read_config(primary)[1] if primary else {}
    for group in _groups_chosen_on_command_line(overrides):
        swaps += _drop(cfg, group, recipe_body.get(group), recipe_choices.get(group, default_choices.get(group)),
                       choices.get(group), overrides, config_dirs)
    return swaps


def _drop(cfg: Any, group: str, written: Any, written_for: Optional[str], chosen: Optional[str],
          kept: List[str], config_dirs: List[str], source: Optional[str] = None,
          by: str = "on the command line") -> List[GroupSwap]:
    """Drop the keys a file `written` for its choice `written_for` of `group`, now `chosen`; keys named in `kept`
    (overrides, or full keys) stay. Returns the swap, if any key went."""
    from omegaconf import open_dict

    if chosen == written_for or not isinstance(written, dict):
        return []
    node = cfg.get(group)
    if node is None or not hasattr(node, "keys"):
        return []
    own_node = _group_node(config_dirs, group, chosen)
    dropped = []
    with open_dict(cfg):
        for key in written:
            if _set_on_command_line(f"{group}.{key}", kept) or key not in node:
                continue
            if isinstance(own_node, dict) and key in own_node:
                node[key] = own_node[key]
            else:
                del node[key]
            dropped.append(f"{group}.{key}")
        if own_node is None and len(node) == 0:
            cfg[group] = None
    return [GroupSwap(group, written_for, chosen, dropped, source, by)] if dropped else []


def _groups_chosen_on_command_line(overrides: List[str]) -> List[str]:
    """`scheduler=none`, `+model=mine`: a group name (no dots) on the left of `=`."""
    groups = []
    for item in overrides:
        key, equals, _ = item.partition("=")
        key = key.lstrip("+~")
        if equals and key and "." not in key and "@" not in key and "/" not in key and key not in groups:
            groups.append(key)
    return groups


def _set_on_command_line(key: str, overrides: List[str]) -> bool:
    for item in overrides:
        name = item.partition("=")[0].lstrip("+~")
        if name == key or name.startswith(key + ".") or name.startswith(key + "["):
            return True
    return False


RECIPE_FOLDER = "recipes://"  # a user's folder of recipes: the `recipe` group itself (hydra_plugins/runner_searchpath)


def config_folders(config_sources) -> List[str]:
    """The folders of Hydra's search path (hydra.runtime.config_sources) that hold YAML files: each file:// root as
    its path, and each of the user's recipe folders as recipes://<path>."""
    return [str(source.path) if source.schema == "file" else f"{RECIPE_FOLDER}{source.path}"
            for source in config_sources if source.schema in ("file", "recipes")]


def _find_config(config_dirs: List[str], group: Optional[str], name: Optional[str]) -> Optional[Path]:
    """The first file on Hydra's search path for `group/name.yaml` (as Hydra picks it)."""
    if not name:
        return None
    for folder in config_dirs:
        if folder.startswith(RECIPE_FOLDER):
            path = Path(folder[len(RECIPE_FOLDER):]) / f"{name}.yaml" if group == "recipe" else None
        else:
            path = Path(folder) / (group or "") / f"{name}.yaml"
        if path is not None and path.is_file():
            return path
    return None


def _read_config(path: Path) -> tuple:
    """(the file's body without its defaults, {group: option} from its defaults list)."""
    import yaml

    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}, {}
    if not isinstance(body, dict):
        return {}, {}
    chosen = {}
    for entry in body.pop("defaults", None) or []:
        if isinstance(entry, dict):
            for name, option in entry.items():
                name = str(name).replace("override ", "").replace("optional ", "").strip().lstrip("/")
                if "@" not in name:
                    chosen[name] = None if option is None else str(option)
    return body, chosen


def _group_node(config_dirs: List[str], group: str, option: Optional[str]) -> Any:
    """What the option's file puts under the group's key (None for a file that sets it to null, or no file)."""
    path = _find_config(config_dirs, group, option)
    if path is None:
        return None
    body, _ = _read_config(path)
    first_line = path.read_text(encoding="utf-8").split("\n", 1)[0]
    return body.get(group) if "@package _global_" in first_line else body


def group_default_origin(key: str, target: Any, choices: Dict[str, Any], config_dirs: List[str]) -> Optional[Path]:
    """The group option's file that put `key` (model.vocab_size) into a node whose `_target_` is no longer that
    file's own: a recipe that sets model._target_ to the user's class without `override /model: null` keeps the
    default option's keys under it."""
    group, _, rest = key.partition(".")
    name = rest.split(".")[0].split("[")[0]
    option = choices.get(group)
    node = _group_node(config_dirs, group, option)
    if isinstance(node, dict) and name in node and node.get("_target_") != target:
        return _find_config(config_dirs, group, option)
    return None
