"""Objects from their `_target_` nodes: the only caller of `hydra.utils.instantiate`.

Targets are checked against an allow-list of module prefixes (`allowed_targets` in the config) and for
importability in the parent process, before any worker starts, so a typo fails in a second with its key.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from contextlib import contextmanager
from typing import Any, Iterator

import hydra.utils
from hydra.errors import InstantiationException
from torch import nn

from runner.config import param_groups
from runner.errors import ConfigError, Problem, RunnerError, first_line

log = logging.getLogger(__name__)

REQUIRED_TARGETS = ("model", "optimizer", "data", "task")
OPTIONAL_TARGETS = ("scheduler",)


# Callables that run arbitrary code or shell commands (or write over files), refused even under an allowed prefix: a
# recipe is trusted like a Python script (docs/troubleshooting.md, "Recipes are code"), but an allow-listed prefix
# should not hide an escape hatch.
REFUSED_TARGETS = (
    "torch.utils.collect_env", "torch.hub", "torch.utils.cpp_extension", "torch.utils.model_zoo", "torch.package",
    "torch.ops.load_library", "torch.classes.load_library", "torch.distributed.rpc", "torch.jit.load",
    "torch.serialization.load", "torch._C", "torch._dynamo", "torch._inductor",
    # torch's launchers run a command line (torch.distributed.run.main(["--no-python", "touch", ...])); torch.save
    # writes over any file it is given.
    "torch.distributed.run", "torch.distributed.launch", "torch.distributed.launcher", "torch.distributed.elastic",
    "torch.save", "torch.serialization.save",
    "hydra.utils", "builtins", "os.",
    "subprocess", "sys.", "importlib", "runpy", "pickle", "shutil", "code.", "ctypes",
    # Where the callables above live under their own names (os.system is posix.system, pickle.loads _pickle.loads):
    # a target is also judged by what it resolves to, so that a path through another module's namespace
    # (torch.functional.os.system) is no way around this list.
    "posix", "nt.", "_pickle", "_ctypes", "_posixsubprocess", "marshal", "pty",
)
# Allowed only with weights_only: true (no code runs while loading), whatever path names it.
LOADS_PICKLES = ("torch.load", "torch.serialization.load")


def target_problems(nodes: dict[str, Any], allowed_prefixes: list[str]) -> list[Problem]:
    """Every missing, disallowed, refused or unimportable `_target_` among the given nodes (key -> node), at any
    depth: a model's arguments may hold `_target_` nodes of their own, and Hydra builds those too."""
    problems = []
    for key, node in nodes.items():
        if node is None and key in OPTIONAL_TARGETS:
            continue
        if not isinstance(node, dict) or "_target_" not in node:
            problems.append(Problem(f"{key}._target_", f"is missing; set {key}._target_ to a class or function path"))
            continue
        for path, nested in _target_nodes(node, key):
            problems += _one_target_problems(path, nested, allowed_prefixes)
    return problems


def targets_outside(key: str, node: Any, allowed_prefixes: list[str]) -> list[tuple[str, str]]:
    """(key path, target) of each `_target_` in `node`, at any depth, that is under none of `allowed_prefixes`."""
    return [(f"{path}._target_", str(nested["_target_"])) for path, nested in _target_nodes(node, key)
            if not _allowed(str(nested["_target_"]), allowed_prefixes)]


def _allowed(target: str, allowed_prefixes: list[str]) -> bool:
    return any(target.startswith(prefix) for prefix in allowed_prefixes)


def _target_nodes(node: Any, path: str) -> Iterator[tuple[str, dict]]:
    """(key path, node) of every dict holding a `_target_`, outermost first."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield path, node
        for name, value in node.items():
            yield from _target_nodes(value, f"{path}.{name}")
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _target_nodes(value, f"{path}[{index}]")


def _one_target_problems(path: str, node: dict, allowed_prefixes: list[str]) -> list[Problem]:
    target = str(node["_target_"])
    key = f"{path}._target_"
    if _is_refused(target) and target not in LOADS_PICKLES:
        return [_refused(key, target)]
    if node.get("trust_remote_code") is True:
        return [Problem(f"{path}.trust_remote_code", "is true: that runs code downloaded with the model or dataset, "
                                                      "which a recipe may not ask for; set it to false")]
    if not _allowed(target, allowed_prefixes):
        return [Problem(key, f"'{target}' is not under an allowed module prefix ({', '.join(allowed_prefixes)}); "
                             f"add its package to allowed_targets, e.g. allowed_targets='[{', '.join(allowed_prefixes)}, "
                             f"{target.split('.')[0]}.]'")]
    reason, names, _ = _resolve(target)
    if reason:
        return [Problem(key, f"cannot import '{target}': {reason}")]
    # What the path resolved to, under its own names: the modules it passed through and the object's home.
    if target in LOADS_PICKLES or any(name in LOADS_PICKLES for name in names):
        if node.get("weights_only") is not True:
            alias = "" if target == "torch.load" else " (that is torch.load)"
            return [Problem(key, f"'{target}'{alias} without weights_only: true can run code hidden in the file; set "
                                 f"{path}.weights_only=true")]
        return []
    refused = next((name for name in names if _is_refused(name)), None)
    if refused:
        return [_refused(key, target, refused)]
    return []


# What a config read from a run dir may call to build its model: the factories of the model types it may name.
MODEL_FACTORY_METHODS = ("from_config", "from_pretrained")  # transformers' AutoModel*.from_config, ...
MODEL_FUNCTIONS = "runner.models."  # the runner's own model functions (runner.models.from_pretrained)


def data_target_problems(key: str, node: Any, source: str) -> list[Problem]:
    """A config that is data (a run dir's, read by `runner sample`), checked beyond target_problems: each target
    builds an object and does nothing else. It must be a class, a model factory method of one
    (AutoModelForCausalLM.from_config) or a function of the runner's own models; any other function acts when
    called, and the allow-list's torch. prefix holds many that act on files or processes."""
    problems = []
    for path, nested in _target_nodes(node, key):
        target = str(nested["_target_"])
        _, _, obj = _resolve(target)
        if inspect.isclass(obj) or (inspect.ismethod(obj) and inspect.isclass(obj.__self__)
                                    and obj.__name__ in MODEL_FACTORY_METHODS):
            continue
        if callable(obj) and f"{getattr(obj, '__module__', '')}.".startswith(MODEL_FUNCTIONS):
            continue
        problems.append(Problem(f"{path}._target_", (
            f"is '{target}' in {source}, which is not a class: a run dir's config may only name classes (their "
            f"{' or '.join(MODEL_FACTORY_METHODS)} too) and functions of {MODEL_FUNCTIONS[:-1]} to build its model, "
            "as any other function could act on files or processes when called")))
    return problems


def _is_refused(name: str) -> bool:
    return any(name == refused.rstrip(".") or name.startswith(refused if refused.endswith(".") else refused + ".")
               for refused in REFUSED_TARGETS)


def _refused(key: str, target: str, resolved: str | None = None) -> Problem:
    what = f"'{target}'" if resolved is None or resolved == target else f"'{target}' (that is {resolved})"
    return Problem(key, f"{what} runs arbitrary code or commands (or writes over files) and is refused as a "
                        "target, whatever allowed_targets says; build what you need in your own package and name that")


def _resolve(path: str) -> tuple[str | None, list[str], Any]:
    """(why `path` (package.module.attribute) cannot be imported, or None; the names of what it resolved to: each
    module it passed through by its own name, and the object's home, module.qualname; the object)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # this prefix is not a module; try a shorter one
            return f"importing {module_name} failed ({err})", [], None
        except Exception as err:  # the module exists but raises on import
            return f"importing {module_name} failed ({type(err).__name__}: {err})", [], None
        names = [module_name]
        for depth, attribute in enumerate(parts[split:], start=split):
            if not hasattr(obj, attribute):
                return f"{'.'.join(parts[:depth])} has no attribute '{attribute}'", [], None
            obj = getattr(obj, attribute)
            if inspect.ismodule(obj):
                names.append(obj.__name__)
        home, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        # torch's C types (torch.Generator is torch._C.Generator) are public under torch.: torch._C is refused as a
        # path, for its private functions, not as the home of a public name.
        if isinstance(home, str) and isinstance(qualname, str) and not home.startswith("torch._C"):
            names.append(f"{home}.{qualname}")
        return None, names, obj
    return f"no module named '{parts[0]}'", [], None


def instantiate(key: str, node: dict[str, Any], *args, **kwargs) -> Any:
    """hydra.utils.instantiate with plain Python containers, and errors that name the config key."""
    try:
        return hydra.utils.instantiate(node, *args, _convert_="all", **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, RunnerError):
            raise err.__cause__ from None
        raise refusal(key, node, err.__cause__ or err) from err


def call_built(key: str, node: dict[str, Any], factory, *args, **kwargs) -> Any:
    """Call what a `_partial_: true` node built (an optimizer with the parameters, a scheduler with the optimizer):
    where the library checks its arguments, so its errors get the config key too."""
    try:
        return factory(*args, **kwargs)
    except RunnerError:
        raise
    except (ValueError, TypeError, AssertionError, RuntimeError, KeyError) as err:
        raise refusal(key, node, err) from err


# Library wording for an argument whose name it does not spell out.
ARGUMENT_WORDS = {"lr": ("learning rate",), "eps": ("epsilon",), "betas": ("beta parameter",)}


def refusal(key: str, node: dict[str, Any], cause: BaseException) -> ConfigError:
    """A library refused the arguments of `key`'s target: name the argument its message mentions, if any."""
    message = first_line(cause, default=type(cause).__name__)
    lowered = message.lower()
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", message)
    if isinstance(cause, TypeError) and unexpected and unexpected.group(1) in node:
        return ConfigError(f"{key}.{unexpected.group(1)}", f"is not an argument of {node.get('_target_')}; "
                                                           f"{_arguments(node.get('_target_'))}")
    if isinstance(cause, TypeError):  # lr=abc: the library compares a number with the text it got
        for name, value in node.items():
            default = _default_of(node.get("_target_"), name)
            if isinstance(value, str) and isinstance(default, (int, float)) and not isinstance(default, bool):
                return ConfigError(f"{key}.{name}", f"is '{value}', text where {node.get('_target_')} takes a number "
                                                    f"(its default: {default})")
    missing = re.search(r"missing \d+ required positional arguments?: '(\w+)'", message)
    if isinstance(cause, TypeError) and missing:
        return ConfigError(f"{key}.{missing.group(1)}", f"is required by {node.get('_target_')} and not set")
    for name in node:
        if name.startswith("_"):
            continue
        words = (name, name.replace("_", " "), *ARGUMENT_WORDS.get(name, ()))
        if any(_mentions(lowered, word.lower()) for word in words):
            return ConfigError(f"{key}.{name}", f"is {node[name]!r}, which {node.get('_target_')} refuses: {message}")
    return ConfigError(key, f"building {node.get('_target_')} failed: {type(cause).__name__}: {message}")


def _parameters(target: Any) -> dict[str, inspect.Parameter] | None:
    """The parameters of a target's constructor or function, or None where its signature cannot be read."""
    try:
        return dict(inspect.signature(hydra.utils.get_object(str(target))).parameters)
    except (ValueError, TypeError, ImportError):
        return None


def _default_of(target: Any, name: str) -> Any:
    """The default value of argument `name` of a target's constructor or function (None when it has none)."""
    parameter = (_parameters(target) or {}).get(name)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _arguments(target: str) -> str:
    """"it takes a, b, c" for a target's constructor or function, as far as its signature tells."""
    parameters = _parameters(target)
    if parameters is None:
        return "see its documentation for the arguments it takes"
    names = [name for name, parameter in parameters.items()
             if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) and name != "self"]
    return f"it takes {', '.join(names)}" if names else "it takes no arguments"


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![a-z0-9_]){re.escape(word)}(?![a-z0-9_])", text) is not None


def build_model(node: dict[str, Any]) -> nn.Module:
    model = instantiate("model", node)
    if not isinstance(model, nn.Module):
        raise ConfigError("model._target_", f"built a {type(model).__name__}, not a torch.nn.Module")
    return model


def build_optimizer(node: dict[str, Any], model: nn.Module):
    """The optimizer node is `_partial_: true`: it is called here with the model's parameters, split into the
    parameter groups its `param_groups` names (runner/config/param_groups.py)."""
    own, groups = param_groups.split_node(node)
    factory = instantiate("optimizer", own)
    if not groups:
        return call_built("optimizer", own, factory, model.parameters())
    split = param_groups.parameter_groups(model, groups)
    optimizer = call_built("optimizer", own, factory, list(split.values()))
    param_groups.check_options(optimizer, groups)
    log.info("%s", param_groups.describe(optimizer, split, groups))
    return optimizer


def build_scheduler(node: dict[str, Any] | None, optimizer, total_steps: int):
    """A `_partial_` scheduler, called with the optimizer, and with `total_steps` when its signature takes it."""
    if node is None:
        return None
    factory = instantiate("scheduler", node)
    if "total_steps" in inspect.signature(factory).parameters:
        return call_built("scheduler", node, factory, optimizer, total_steps=total_steps)
    return call_built("scheduler", node, factory, optimizer)


def build_data(node: dict[str, Any]):
    """A datasets.DatasetDict with `train` and `validation` splits. datasets' own progress bars (generating a
    split, Map, Filter) stay off the console meanwhile: the run logs what it built (a Hub download's bars, which
    huggingface_hub draws, still show)."""
    with _datasets_progress_bars_off():
        splits = instantiate("data", node)
    missing = [name for name in ("train", "validation") if name not in splits]
    if missing:
        raise ConfigError(
            "data._target_",
            f"'{node['_target_']}' returned no {' and no '.join(missing)} split; it must return a "
            f"datasets.DatasetDict with train and validation (it has: {', '.join(splits)})",
        )
    return splits


@contextmanager
def _datasets_progress_bars_off() -> Iterator[None]:
    from datasets.utils import logging as datasets_logging

    was_enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets_logging.enable_progress_bar()


def build_task(node: dict[str, Any]):
    return instantiate("task", node)

