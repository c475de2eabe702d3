"""The recipe's keys under a config group the command line swapped, and where a group's default came from: read
from the config files on Hydra's search path (plain YAML, no Hydra)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional


# A group swapped on the command line: the recipe's keys for it were written for the recipe's own choice.


@dataclass(frozen=True)
class GroupSwap:
    """A config group the command line set to something other than what the recipe chose."""

    group: str
    recipe_choice: Optional[str]
    chosen: Optional[str]
    dropped: List[str]
    """The recipe's keys under the group that were removed (or set back to the chosen option's own value)."""

    def describe(self, recipe: str) -> str:
        if self.recipe_choice is None:  # `override /model: null`: the recipe wrote its whole node itself
            replaced, written = f"recipe {recipe}'s own {self.group}", ""
        else:
            replaced, written = f"the {self.recipe_choice} of recipe {recipe}", f" (written for {self.recipe_choice})"
        return (f"{self.group}={self.chosen} on the command line replaces {replaced}: its {', '.join(self.dropped)}"
                f"{written} {'is' if len(self.dropped) == 1 else 'are'} dropped")


def drop_swapped_group_keys(cfg: Any, choices: Dict[str, Any], overrides: List[str], config_dirs: List[str],
                            config_name: str = "config") -> List[GroupSwap]:
    """Remove from `cfg` (in place) the recipe's keys under each group the command line swapped.

    A recipe written for the warmup_cosine schedule sets scheduler.warmup_steps; `scheduler=none` asks for a
    constant learning rate, and that key would be left over on a null node, meaning nothing. The same holds for
    any group: keys the recipe set for its own choice are dropped, those the chosen option sets itself come back
    to its value, and keys set on the command line (scheduler.warmup_steps=5) are kept."""
    from omegaconf import open_dict

    recipe = choices.get("recipe")
    recipe_file = _find_config(config_dirs, "recipe", recipe)
    if recipe_file is None:
        return []
    recipe_body, recipe_choices = _read_config(recipe_file)
    primary = _find_config(config_dirs, None, config_name)
    default_choices = _read_config(primary)[1] if primary else {}
    swaps = []
    for group in _groups_chosen_on_command_line(overrides):
        recipe_choice = recipe_choices.get(group, default_choices.get(group))
        chosen = choices.get(group)
        recipe_node = recipe_body.get(group)
        if chosen == recipe_choice or not isinstance(recipe_node, dict):
            continue
        node = cfg.get(group)
        if node is None or not hasattr(node, "keys"):
            continue
        own_node = _group_node(config_dirs, group, chosen)
        dropped = []
        with open_dict(cfg):
            for key in recipe_node:
                if _set_on_command_line(f"{group}.{key}", overrides) or key not in node:
                    continue
                if isinstance(own_node, dict) and key in own_node:
                    node[key] = own_node[key]
                else:
                    del node[key]
                dropped.append(f"{group}.{key}")
            if own_node is None and len(node) == 0:
                cfg[group] = None
        if dropped:
            swaps.append(GroupSwap(group, recipe_choice, chosen, dropped))
    return swaps


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
