"""The optimizer's parameter groups, named in its config: which parameters get options of their own.

    optimizer:
      weight_decay: 0.1
      param_groups:
        no_decay: {select: [biases, norms], weight_decay: 0.0}

Transformer training leaves biases and normalisation weights out of weight decay (nanoGPT decays only tensors of
2 or more dimensions; HF Trainer and torchtune exclude biases and LayerNorm weights), so conf/optimizer/
adamw_transformer.yaml does just that. A group's `select` lists `biases` (parameters named `bias`), `norms` (every
parameter of a normalisation layer: LayerNorm, RMSNorm, BatchNorm, GroupNorm... by class, or a class whose name ends
in `Norm`) or shell-style patterns on parameter names (`head.*`, `*.embed*`). A parameter goes to the first group that
selects it; the parameters no group selects form one more group, first, with the optimizer's own options. A pattern
that matches no name, a group with a pattern left with no parameter, or an option the optimizer does not have is an
error naming its key (torch would take an unknown group option silently); a model without biases or norms just has
no such group.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any

from torch import nn

from runner.errors import ConfigError

log = logging.getLogger(__name__)

KEY = "param_groups"  # the runner's key in the optimizer node: never passed to the optimizer itself
NAMED_SELECTIONS = ("biases", "norms")
NORM_LAYERS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.LocalResponseNorm,
               *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))


def split_node(node: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the optimizer's own node, its named parameter groups)."""
    node = dict(node)
    groups = node.pop(KEY, None) or {}
    if not isinstance(groups, dict):
        raise ConfigError(f"optimizer.{KEY}", f"is {groups!r}; it must map group names to "
                                              "{select: [...], <option>: <value>}, e.g. "
                                              "no_decay: {select: [biases, norms], weight_decay: 0.0}")
    return node, groups


OTHERS = "others"  # the log's name for the parameters no group selects


def parameter_groups(model: nn.Module, groups: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Group name -> torch's param-group dict: the parameters no group selects first (OTHERS: the optimizer's own
    options; left out when empty), then one per named group, in config order. Tied parameters count once
    (named_parameters skips repeats)."""
    named = dict(model.named_parameters())
    norms = {id(parameter) for module in model.modules() if _is_norm(module)
             for parameter in module.parameters(recurse=False)}
    taken: dict[str, str] = {}  # parameter name -> group
    for group, spec in groups.items():
        key = f"optimizer.{KEY}.{group}"
        if not isinstance(spec, dict) or not spec.get("select"):
            raise ConfigError(f"{key}.select", "is not set; list what the group holds: biases, norms, or a pattern "
                                               "on parameter names such as 'head.*'")
        for selector in _as_list(spec["select"]):
            matched = [name for name, parameter in named.items()
                       if _selects(str(selector), name, id(parameter) in norms)]
            if not matched and selector not in NAMED_SELECTIONS:  # a model may have no biases; a pattern, a typo
                raise ConfigError(f"{key}.select", f"'{selector}' selects no parameter of "
                                                   f"{type(model).__name__}; use {' or '.join(NAMED_SELECTIONS)}, or "
                                                   f"a pattern on its names (e.g. {', '.join(list(named)[:3])})")
            for name in matched:
                taken.setdefault(name, group)
    others = [parameter for name, parameter in named.items() if name not in taken]
    result = {OTHERS: {"params": others}} if others else {}
    for group, spec in groups.items():
        members = [parameter for name, parameter in named.items() if taken.get(name) == group]
        if not members and all(str(selector) in NAMED_SELECTIONS for selector in _as_list(spec["select"])):
            log.info("optimizer.%s.%s: %s has no %s; the group is left out", KEY, group, type(model).__name__,
                     " or ".join(map(str, _as_list(spec["select"]))))
            continue
        if not members:
            raise ConfigError(f"optimizer.{KEY}.{group}.select", f"selects no parameter of {type(model).__name__} "
                                                                 "that an earlier group does not already hold (a "
                                                                 "parameter joins the first group that selects it)")
        result[group] = {"params": members, **{option: value for option, value in spec.items() if option != "select"}}
    return result


def check_options(optimizer, groups: dict[str, dict[str, Any]]) -> None:
    """Each group option is one the optimizer has (its `defaults`)."""
    for group, spec in groups.items():
        for option in spec:
            if option != "select" and option not in optimizer.defaults:
                raise ConfigError(f"optimizer.{KEY}.{group}.{option}",
                                  f"is not an option of {type(optimizer).__name__}; its options are "
                                  f"{', '.join(sorted(optimizer.defaults))}")


def describe(optimizer, split: dict[str, dict[str, Any]], groups: dict[str, dict[str, Any]]) -> str:
    """One line for the log: each group's name, tensors and values, and the options its config sets
    ("AdamW parameter groups: others 13 tensors (67,968 values); no_decay 17 tensors (1,162 values), weight_decay=0")."""
    parts = []
    for name, group in split.items():
        values = sum(parameter.numel() for parameter in group["params"])
        own = "".join(f", {option}={group[option]}" for option in groups.get(name, {}) if option != "select")
        parts.append(f"{name} {len(group['params'])} tensors ({values:,} values){own}")
    return f"{type(optimizer).__name__} parameter groups: " + "; ".join(parts)


def _selects(selector: str, name: str, in_norm: bool) -> bool:
    if selector == "biases":
        return name == "bias" or name.endswith(".bias")
    if selector == "norms":
        return in_norm
    return fnmatch.fnmatchcase(name, selector)


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, NORM_LAYERS) or type(module).__name__.endswith("Norm")


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]
