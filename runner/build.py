"""Objects from their `_target_` nodes: the only caller of `hydra.utils.instantiate`.

Targets are checked against an allow-list of module prefixes (`allowed_targets` in the config) and for
importability in the parent process, before any worker starts, so a typo fails in a second with its key.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Iterable

import hydra.utils
from hydra.errors import InstantiationException
from torch import nn

from runner.errors import ConfigError, Problem, RunnerError

REQUIRED_TARGETS = ("model", "optimizer", "data", "task")
OPTIONAL_TARGETS = ("scheduler",)


def target_problems(nodes: dict[str, Any], allowed_prefixes: list[str]) -> list[Problem]:
    """Every missing, disallowed or unimportable `_target_` among the given nodes (key -> node)."""
    problems = []
    for key, node in nodes.items():
        if node is None and key in OPTIONAL_TARGETS:
            continue
        if not isinstance(node, dict) or "_target_" not in node:
            problems.append(Problem(f"{key}._target_", f"is missing; set {key}._target_ to a class or function path"))
            continue
        target = node["_target_"]
        if not any(target.startswith(prefix) for prefix in allowed_prefixes):
            problems.append(
                Problem(
                    f"{key}._target_",
                    f"'{target}' is not under an allowed module prefix ({', '.join(allowed_prefixes)}); "
                    f"add its package to allowed_targets, e.g. allowed_targets='[{', '.join(allowed_prefixes)}, "
                    f"{target.split('.')[0]}.]'",
                )
            )
            continue
        reason = _import_problem(target)
        if reason:
            problems.append(Problem(f"{key}._target_", f"cannot import '{target}': {reason}"))
    return problems


def _import_problem(path: str) -> str | None:
    """Why `path` (package.module.attribute) cannot be imported, or None when it can."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # this prefix is not a module; try a shorter one
            return f"importing {module_name} failed ({err})"
        except Exception as err:  # the module exists but raises on import
            return f"importing {module_name} failed ({type(err).__name__}: {err})"
        for depth, attribute in enumerate(parts[split:], start=split):
            if not hasattr(obj, attribute):
                return f"{'.'.join(parts[:depth])} has no attribute '{attribute}'"
            obj = getattr(obj, attribute)
        return None
    return f"no module named '{parts[0]}'"


def instantiate(key: str, node: dict[str, Any], *args, **kwargs) -> Any:
    """hydra.utils.instantiate with plain Python containers, and errors that name the config key."""
    try:
        return hydra.utils.instantiate(node, *args, _convert_="all", **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, RunnerError):
            raise err.__cause__ from None
        cause = err.__cause__ or err
        raise ConfigError(
            key, f"building {node.get('_target_')} failed: {type(cause).__name__}: {_first_line(cause)}"
        ) from err


def build_model(node: dict[str, Any]) -> nn.Module:
    model = instantiate("model", node)
    if not isinstance(model, nn.Module):
        raise ConfigError("model._target_", f"built a {type(model).__name__}, not a torch.nn.Module")
    return model


def build_optimizer(node: dict[str, Any], parameters: Iterable[nn.Parameter]):
    """The optimizer node is `_partial_: true`: it is called here with the model's parameters."""
    return instantiate("optimizer", node)(parameters)


def build_scheduler(node: dict[str, Any] | None, optimizer, total_steps: int):
    """A `_partial_` scheduler, called with the optimizer, and with `total_steps` when its signature takes it."""
    if node is None:
        return None
    factory = instantiate("scheduler", node)
    if "total_steps" in inspect.signature(factory).parameters:
        return factory(optimizer, total_steps=total_steps)
    return factory(optimizer)


def build_data(node: dict[str, Any]):
    """A datasets.DatasetDict with `train` and `validation` splits."""
    splits = instantiate("data", node)
    missing = [name for name in ("train", "validation") if name not in splits]
    if missing:
        raise ConfigError(
            "data._target_",
            f"'{node['_target_']}' returned no {' and no '.join(missing)} split; it must return a "
            f"datasets.DatasetDict with train and validation (it has: {', '.join(splits)})",
        )
    return splits


def build_task(node: dict[str, Any]):
    return instantiate("task", node)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0] if "full_key" not in text else text.split("\nfull_key")[0].replace("\n", " ")
