"""One run's config: composed by Hydra from conf/, the recipe and the command line, the recipe's keys for a group
swapped on the command line dropped, frozen into the typed RunConfig, checked, and resolved for this machine
(hardware, batch plan, the checkpoint to resume from). Errors name the key the user set.

`load(overrides)` is what the tools use (`runner plan`, `runner recipes validate`, `python -m runner.launch`);
`python -m runner` composes through Hydra's own entry (runner/commands/cli.py) and then calls `freeze` and `preflight`."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from difflib import get_close_matches
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError,
)

from runner.checkpoint import find_resume, refuse_inexact_resume
from runner.checkpoint.remote import Storage
from runner.config import RunConfig, RunSpec, plain
from runner.config.groups import config_folders, drop_swapped_group_keys, group_default_origin
from runner.config.search_path import config_dir
from runner.distributed.devices import resolve_hardware
from runner.distributed.dist import requeued_by_submitit, restart_count, writes_run_dir
from runner.errors import ConfigError, Problem, RunnerError, write_failure, yaml_problem
from runner.ground import install_hint
from runner.run.checks import check
from runner.run.resolvers import register_configs
from runner.training.batch_plan import batch_plan

log = logging.getLogger("runner")


register_configs()

# An absolute path: `python -m runner` works from any working directory, from a checkout or an installed wheel.
CONFIG_DIR = str(config_dir())
CONFIG_NAME = "config"
# Targets a Hydra callback may name besides allowed_targets: Hydra's own callbacks.
CALLBACK_PREFIXES = ("runner.sweep.", "hydra.experimental.callbacks.")
# Hydra configs that a plugin brings, and the extra that installs the plugin (conf/hparams_search,
# conf/hydra/launcher).
PLUGIN_EXTRAS = {"hydra/sweeper/optuna": "sweeps", "hydra/launcher/joblib": "sweeps",
                 "hydra/launcher/submitit_slurm": "slurm", "hydra/launcher/submitit_local": "slurm"}


def composition_error(err: BaseException, overrides: list[str]) -> ConfigError | str:
    """What Hydra refused while composing, in the runner's words where the key or option is known (a misspelled
    key with its closest setting, a bad value, an option a group lacks with the ones it has); otherwise Hydra's
    message plus the OmegaConf error behind it (which names the full key); for an override that does not parse,
    which one it is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    text = str(err).strip()
    plugin = re.search(r"Could not (?:find|load) '(hydra/(?:sweeper|launcher)/\w+)'", text)
    if plugin and plugin.group(1) in PLUGIN_EXTRAS:  # a Hydra plugin that an optional extra installs
        return (f"{text.splitlines()[0].rstrip('.')}: that config comes with a Hydra plugin that is not installed; "
                f"install it with {install_hint(PLUGIN_EXTRAS[plugin.group(1)])}")
    missing = re.match(r"In '[^']*': Could not (find|load) '([\w/]+)/([^']+)'", text)
    if missing:
        problem = missing_option_problem(text, *missing.groups())
        if problem is not None:
            return ConfigError([problem])
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        if re.match(r"Could not override '", text) and isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
            return ConfigError([unknown_key_problem(cause, overrides)])
        if text.startswith("Error merging override") and isinstance(cause, ValidationError):
            return ConfigError([Problem(cause.full_key, str(cause).splitlines()[0])])
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip() not in text:
        text += "\n" + str(cause).strip()
    if isinstance(err, OverrideParseException):
        for override in overrides:
            try:
                OverridesParser.create().parse_overrides([override])
            except OverrideParseException:
                return f"the command-line override {override!r} does not parse: {text}"
    return text


def missing_option_problem(text: str, how: str, group: str, name: str) -> Problem | None:
    """`precision=fp64`: the options Hydra found for the group (in every config source: the runner's conf/, the
    user's recipe folders, plugins), without its search-path dump. "Could not load" is an unknown name in a list
    group (logger=[tensorboard,tensorbord]), for which Hydra lists no options: they are read from conf/."""
    listed = re.search(r"Available options in '[^']*':\n((?:\t.*\n?)+)", text)
    if listed:
        options = [line.strip() for line in listed.group(1).splitlines() if line.strip()]
    elif how == "load":
        options = group_options(group)
    else:
        return None
    if not options:
        return None
    where = (" (besides the built-in recipes, the recipe group reads ./recipes/ of the working directory and the "
             "folders in $RUNNER_RECIPE_PATH)" if group == "recipe" else "")
    close = get_close_matches(name, options, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return Problem(group, f"'{name}' is not one of its options; {hint}the valid names are {', '.join(options)}{where}")


# Groups whose options are a list (`logger=[tensorboard,csv]`): each chosen option is a key under the group.
LIST_GROUPS = ("callbacks", "logger")


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (Path(CONFIG_DIR) / group).glob("*.yaml"))


def unknown_key_problem(cause: OmegaConfBaseException, overrides: list[str]) -> Problem:
    """`trainer.batch_sze=32`: a key the config does not have. In a typed section (trainer, checkpoint, ...) the
    message keys_outside_the_schema gives its `+` form; in a free-form one (model, data: a target's arguments) the
    `+` form is how to give the target an argument its group does not list."""
    from dataclasses import fields, is_dataclass

    full_key = cause.full_key
    path, _, key = full_key.rpartition(".")
    if is_dataclass(cause.object_type):
        return unknown_setting_problem(full_key, [field.name for field in fields(cause.object_type)])
    parent = cause.parent_node
    names = [str(name) for name in parent.keys()] if isinstance(parent, DictConfig) else []
    if path in LIST_GROUPS and key in group_options(path):  # callbacks.early_stopping.patience=3, not selected
        chosen = ",".join([*names, key])
        return Problem(full_key, f"is an option of {path} that this run does not select ({path} holds "
                                 f"{', '.join(names) or 'none'}); select it with {path}=[{chosen}] and keep this "
                                 f"setting beside it")
    where = path or "the config"
    close = get_close_matches(key, names, n=1)
    hint = f"; did you mean {path + '.' if path else ''}{close[0]}?" if close else "."
    given = next((item for item in overrides if item.split("=", 1)[0] == full_key
                  or item.startswith(f"{full_key}.")), None)
    plus = f" To add a key {where} does not have (an argument of its target), give it with +: +{given}" if given else ""
    keys = f" (its keys: {', '.join(names)})" if names else ", which is empty"
    return Problem(full_key, f"is not a key of {where}{keys}{hint}{plus}".rstrip("."))


def unknown_setting_problem(full_key: str, names: list[str]) -> Problem:
    """A key that a typed section (its dataclass has `names`) does not have, with the closest setting."""
    path, _, key = full_key.rpartition(".")
    close = get_close_matches(key, names, n=1)
    hint = f"did you mean {path + '.' if path else ''}{close[0]}? " if close else ""
    return Problem(full_key, f"is not a setting{f' of {path}' if path else ''}, so nothing would read it; {hint}"
                             f"the settings are {', '.join(names)}")


def callback_problems(cfg: DictConfig) -> list:
    """hydra.callbacks are built by Hydra before any run starts: their targets pass the same checks as the
    recipe's."""
    from runner.config.instantiate import target_problems

    callbacks = OmegaConf.to_container(cfg.hydra.callbacks, resolve=False) or {}
    allowed = [*OmegaConf.select(cfg, "allowed_targets", default=[]), *CALLBACK_PREFIXES]
    return target_problems({f"hydra.callbacks.{name}": node for name, node in callbacks.items()}, allowed)


def sweep_problems(cfg: DictConfig, overrides: list[str]) -> list:
    """What a sweep's trials would each meet, said once before the first starts: a launcher or sweeper that is not
    an installed Hydra plugin (and the sweeper's own targets and study), an interval in a grid, and a swept key the
    config lacks (a typo in `-m trainer.max_step=1,2`, or a search written for another recipe:
    hparams_search=lr_width searches model.d_model). Hydra reports these with a traceback or its own text, which
    for a key advises the `+key=` form that the schema then refuses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    problems = plugin_problems(cfg)
    parsed = OverridesParser.create().parse_overrides(overrides)
    if OmegaConf.select(cfg, "hydra.sweeper._target_") == BASIC_SWEEPER:
        problems += [Problem(override.key_or_group, (
            f"is {override.input_line.partition('=')[2]}, a range a grid cannot list (Hydra's basic sweeper, `-m`, "
            "runs each value it is given); give the values (a,b,c) or range(start,stop,step), or sample the "
            "interval in a search (hparams_search=..., docs/sweeps.md)")) for override in parsed
            if override.is_interval_sweep()]
    return problems + swept_key_problems(cfg, parsed)


def plugin_problems(cfg: DictConfig) -> list:
    """The launcher and sweeper must be installed Hydra plugins; the sweeper's own targets and its study pass the
    checks below."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher
    from hydra.plugins.sweeper import Sweeper

    problems = []
    for section, kind in (("launcher", Launcher), ("sweeper", Sweeper)):
        target = OmegaConf.select(cfg, f"hydra.{section}._target_")
        installed = [f"{plugin.__module__}.{plugin.__name__}" for plugin in Plugins.instance().discover(kind)]
        if target not in installed:
            problems.append(Problem(f"hydra.{section}._target_", (
                f"'{target}' is not a Hydra {section} installed here; choose one with hydra/{section}=NAME "
                f"(`python -m runner --help` lists them), whose classes are {', '.join(installed)}")))
        elif section == "sweeper":
            problems += sweeper_target_problems(cfg) + study_direction_problems(cfg)
    return problems


def swept_key_problems(cfg: DictConfig, parsed: list) -> list:
    """Each key swept on the command line (`parsed`: Hydra's parsed overrides) or searched by hydra.sweeper.params
    that this config lacks, with the closest setting."""
    from difflib import get_close_matches

    problems = []
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default={}) or {}
    swept = {override.key_or_group: ("is swept on the command line", "")
             for override in parsed
             if override.is_sweep_override() and not override.is_add() and override.key_or_group not in choices}
    search = choices.get("hparams_search")
    for key in OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}:
        if not str(key).startswith("+") and key not in choices:
            swept[key] = (f"is searched by hparams_search={search} (its hydra.sweeper.params)",
                          f"; that search was written for another recipe: copy {search}.yaml to search this one's "
                          "keys (docs/sweeps.md, Searches)") if search else ("is searched by hydra.sweeper.params", "")
    for key, (why, remedy) in swept.items():
        if key.startswith("hydra.") or OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False,
                                                      throw_on_resolution_failure=False) is not _ABSENT:
            continue
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
        names = [str(item) for item in node.keys() if item != "hydra"] if isinstance(node, DictConfig) else []
        close = get_close_matches(name, names, n=1)
        problems.append(Problem(key, (
            f"{why}, but this config has no such setting; "
            + (f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else "")
            + (f"{parent or 'the config'} has {', '.join(names)}" if names else f"{parent} is not a section here")
            + remedy)))
    return problems


_ABSENT = object()
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"  # the grid of `-m`
SWEEPER_PREFIXES = ("optuna.",)  # besides allowed_targets: what an Optuna search names (optuna.samplers.TPESampler)


def study_direction_problems(cfg: DictConfig) -> list:
    """An Optuna search continuing a study made in the other direction (a search over val/accuracy, then one over
    val/loss, with the same study_name): Optuna refuses that with a traceback after the sweep has started."""
    from runner.run.resolvers import study_directions

    storage, name = (OmegaConf.select(cfg, f"hydra.sweeper.{key}") for key in ("storage", "study_name"))
    direction = OmegaConf.select(cfg, "hydra.sweeper.direction")
    recorded = study_directions(storage, name) if storage and name and isinstance(direction, str) else []
    mode = cfg.trainer.monitor_mode
    if not recorded or recorded == [direction]:
        return []
    return [Problem("hydra.sweeper.study_name", (
        f"study '{name}' in {storage} was made to {' and '.join(recorded)}, and this search would {direction} "
        f"{cfg.trainer.monitor} (trainer.monitor_mode={getattr(mode, 'value', mode)}): name a new study "
        f"(hydra.sweeper.study_name=...), or search with the monitor that study was made for"))]


def sweeper_target_problems(cfg: DictConfig) -> list:
    """The sweeper builds the `_target_`s of its own config (an Optuna sampler) and calls the function that
    custom_search_space names: both pass the checks of the recipe's targets."""
    from runner.config.instantiate import target_problems

    sweeper = OmegaConf.to_container(cfg.hydra.sweeper, resolve=False) or {}
    allowed = [*OmegaConf.select(cfg, "allowed_targets", default=[]), *SWEEPER_PREFIXES]
    problems = target_problems({f"hydra.sweeper.{name}": node for name, node in sweeper.items()
                                if isinstance(node, dict) and "_target_" in node}, allowed)
    custom = sweeper.get("custom_search_space")
    if custom:
        key = "hydra.sweeper.custom_search_space"
        problems += [replace(problem, key=key) if problem.key == f"{key}._target_" else problem
                     for problem in target_problems({key: {"_target_": str(custom)}}, allowed)]
    return problems


# Where logging's dictConfig imports or calls a name: a handler's or formatter's `class`, a `()` factory anywhere,
# and a value `ext://module.attribute`.
LOGGING_SECTIONS = ("job_logging", "hydra_logging")
LOGGING_PREFIXES = ("logging.",)  # besides allowed_targets: the standard library's handlers, formatters, filters
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")


def logging_problems(cfg: DictConfig) -> list:
    """hydra.job_logging and hydra.hydra_logging are handed to logging.config.dictConfig, which imports and calls the
    names they give: those pass the same checks as the recipe's targets, before Hydra configures any logging."""
    from runner.config.instantiate import target_problems

    allowed = [*OmegaConf.select(cfg, "allowed_targets", default=[]), *LOGGING_PREFIXES]
    named: dict = {}  # key path -> (a target node: the name and the arguments beside it, the key that named it)

    def collect(node, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("class", "()") and isinstance(value, str):
                    arguments = {name: item for name, item in node.items() if name not in ("class", "()")}
                    named[path] = ({"_target_": value, **arguments}, key)
                else:
                    collect(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                collect(value, f"{path}[{index}]")
        elif isinstance(node, str) and node.startswith("ext://") and node not in LOGGING_STREAMS:
            named[path] = ({"_target_": node.removeprefix("ext://")}, None)

    for section in LOGGING_SECTIONS:
        collect(OmegaConf.to_container(cfg.hydra[section], resolve=False) if section in cfg.hydra else {},
                f"hydra.{section}")
    problems = []
    for path, (node, key) in named.items():
        for problem in target_problems({path: node}, allowed):
            if problem.key == f"{path}._target_":  # named as the user wrote it: ....class, ....(), or the ext:// key
                problem = replace(problem, key=f"{path}.{key}" if key else path)
            problems.append(problem)
    return problems


def swap_recipe_groups(cfg: DictConfig, hydra) -> list:
    """A group chosen on the command line (scheduler=none) replaces the recipe's choice together with the keys the
    recipe set for it: drop them, and say which."""
    sources = config_folders(hydra.runtime.config_sources)
    swaps = drop_swapped_group_keys(cfg, dict(hydra.runtime.choices), task_overrides(hydra), sources,
                                    hydra.job.config_name or CONFIG_NAME)
    for swap in swaps:
        log.info("%s", swap.describe(hydra.runtime.choices.get("recipe")))
    return swaps


def task_overrides(hydra) -> list[str]:
    """The command line's overrides as typed (an override like `lr=${x}` stays text, never resolved)."""
    return [str(item) for item in OmegaConf.to_container(hydra.overrides.task, resolve=False)]


def preflight(spec: RunSpec) -> RunSpec:
    """Everything decided once, in this process, before a worker starts: the hardware (processes, GPUs), the batch
    plan, every cross-field check, the checkpoint to resume from, and config.yaml."""
    config = spec.config
    hardware = resolve_hardware(config.hardware, config.gpu_ids)
    hardware.apply()  # CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises: before any check touches CUDA
    check(config, hardware)
    if hardware.physical_gpus:
        log.info("%s", hardware.gpu_table())
    # config.yaml records the process count the run used (a null num_processes resolved here).
    config = replace(config, hardware=replace(config.hardware, num_processes=hardware.processes_per_machine))
    run_dir = Path(spec.run_dir)
    # A restarted group (torchrun --max-restarts) or a requeued submitit job continues from its newest checkpoint on
    # its own.
    resume = config.resume or ("auto" if restart_count() > 0 or requeued_by_submitit() else None)
    # checkpoint.dir: its access is checked now, before training; the machine that writes the run dir fetches (for
    # resume=auto from checkpoint.dir, and resume=<URL>).
    storage = Storage(config.checkpoint.dir) if config.checkpoint.dir and config.checkpoint.enabled else None
    if storage is not None:
        storage.check()
    writer = writes_run_dir(config.hardware.machine_rank)
    resume_from = find_resume(resume, run_dir, config.checkpoint.verify, storage if writer else None, fetch=writer)
    batch = batch_plan(config.trainer, hardware.world_size)
    if resume_from is not None:
        refuse_inexact_resume(resume_from, hardware.world_size, batch.global_batch)
    # One writer, also when machines share the run dir; a debug run (fast_dev_run) writes nothing but its log.
    if writes_run_dir(config.hardware.machine_rank) and config.trainer.fast_dev_run is None:
        _write_config(run_dir, plain(config), resume_from)
    return replace(spec, config=config, hardware=hardware, batch=batch,
                   resume_from=str(resume_from) if resume_from else None)


def load(overrides: list[str]) -> RunSpec:
    """A config composed, frozen and resolved for this machine (hardware and batch plan), without running it or
    writing anything: for the tools (runner.run.validate's command line, the plan). Raises the run's own errors."""
    return resolve(compose_config(overrides))


def compose_config(overrides: list[str]) -> DictConfig:
    """The composed config as Hydra gives it (no `hydra` node), nothing resolved or checked yet."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        problem = composition_error(err, list(overrides))
        raise (problem if isinstance(problem, ConfigError) else ConfigError("config", problem)) from None
    except yaml.YAMLError as err:  # a recipe, conf/ or machine.yaml file that is not YAML
        raise yaml_error(err) from None
    return apply_group_swaps(cfg)


def yaml_error(err: yaml.YAMLError) -> ConfigError:
    """A config file that does not parse, named with its line and column."""
    mark, problem = yaml_problem(err)
    where = f"{mark.name}" if mark is not None else "a config file"
    at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ConfigError(where, f"is not valid YAML{at}: {problem}; fix the file (nothing was run)")


def apply_group_swaps(cfg: DictConfig) -> DictConfig:
    """A config composed with its `hydra` node (return_hydra_config=True) as a run gets it: the recipe's keys for a
    group swapped on the command line dropped, the `hydra` node removed."""
    swap_recipe_groups(cfg, cfg.hydra)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def resolve(cfg: DictConfig) -> RunSpec:
    """load()'s second half: frozen, checked, and resolved for this machine."""
    spec = freeze(cfg, Path.cwd())
    hardware = resolve_hardware(spec.config.hardware, spec.config.gpu_ids)
    check(spec.config, hardware)
    return replace(spec, hardware=hardware, batch=batch_plan(spec.config.trainer, hardware.world_size))


def freeze(cfg: DictConfig, run_dir: Path) -> RunSpec:
    """Resolve every interpolation once, here, and hand workers plain typed objects (never a DictConfig)."""
    added = keys_outside_the_schema(cfg)
    if added:
        raise ConfigError(added)
    if OmegaConf.select(cfg, "trainer.fast_dev_run") is not None:
        without_run_dir_files(cfg)
    try:
        config = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(err.full_key, "is required and has no value; set it on the command line, "
                                        f"e.g. {err.full_key}=...") from None
    except OmegaConfBaseException as err:
        message = str(err).split("\n")[0]
        raise ConfigError(getattr(err, "full_key", None) or "config", message) from None
    assert isinstance(config, RunConfig)
    return RunSpec(config=config, run_dir=str(run_dir))


def keys_outside_the_schema(node: DictConfig, path: str = "") -> list[Problem]:
    """A problem for each key of a schema-typed section (trainer, checkpoint, ...) that its dataclass does not
    have. The schema refuses a misspelled key, but Hydra adds one given with `+` (as its own error advises), and
    nothing would read it: `+trainer.max_step=5` would train the recipe's max_steps without a word. Free-form
    sections (model, data, callbacks: a target's arguments) are not checked here; their targets refuse what they do
    not take."""
    from dataclasses import fields, is_dataclass

    schema = OmegaConf.get_type(node)
    if not is_dataclass(schema):
        return []
    names = [field.name for field in fields(schema)]
    found = []
    for key in node.keys():
        if key not in names:
            found.append(unknown_setting_problem(f"{path}{key}", names))
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            found += keys_outside_the_schema(child, f"{path}{key}.")
    return found


def _write_config(run_dir: Path, resolved: dict, resume_from: Path | None) -> None:
    """config.yaml records how the run was started; a run continued in place keeps its original one."""
    if (run_dir / "config.yaml").is_file():
        log.info("continuing the run in %s from %s; its config.yaml is kept", run_dir, resume_from or "scratch")
        return
    with write_failure(run_dir / "config.yaml", "the run's config.yaml"):
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    if resume_from:
        log.info("this run starts from the checkpoint %s", resume_from)


def with_sources(err: RunnerError, cfg: DictConfig) -> RunnerError:
    """A bad value that came through an interpolation (model.max_len: ${data.seq_len}) is named with the key the
    user set, so the message points at what to change."""
    if not isinstance(err, ConfigError):
        return err
    sources = interpolation_sources(OmegaConf.to_container(cfg, resolve=False))
    problems = [replace(problem, key=f"{problem.key} (from {sources[problem.key]})")
                if problem.key in sources and not problem.message.startswith("is not an argument") else problem
                for problem in err.problems]
    return ConfigError(problems) if problems != err.problems else err


# Groups that build a target: a recipe written for one option of them may not fit another.
TARGET_GROUPS = ("model", "optimizer", "scheduler", "data", "task", "tokenizer")


def with_recipe(err: RunnerError, choices, overrides: list[str]) -> RunnerError:
    """A recipe's group swapped on the command line (recipe=reverse model=mlp) that does not fit what the recipe
    sets: say so, naming the recipe and the pair, after the problem itself."""
    swapped = [item for item in overrides if item.split("=", 1)[0].lstrip("+~") in TARGET_GROUPS and "=" in item]
    if not isinstance(err, ConfigError) or not swapped or not any(
            problem.key.split(".")[0].split("[")[0] in (*TARGET_GROUPS, "trainer") and not problem.of_this_machine
            for problem in err.problems):
        return err
    recipe, pairs = choices.get("recipe"), " ".join(swapped)
    note = Problem("recipe", f"{recipe} is written for its own groups, and {pairs} (from the command line) does not fit "
                             f"what it sets: recipe={recipe} and {pairs} do not go together; use a recipe written for "
                             f"{pairs} (`python -m runner --info defaults` lists the choices) or set the keys above")
    return ConfigError([*err.problems, note])


def with_group_origin(err: RunnerError, hydra) -> RunnerError:
    """`model.vocab_size: is not an argument of mylab.Wide`: when the key came from the model group's default
    option (the recipe replaced its _target_ but kept the group), say so and give the one-line fix."""
    if not isinstance(err, ConfigError):
        return err
    sources = config_folders(hydra.runtime.config_sources)
    choices, recipe = dict(hydra.runtime.choices), hydra.runtime.choices.get("recipe")
    problems = []
    for problem in err.problems:
        found = re.match(r"is not an argument of ([\w.]+)", problem.message)
        origin = found and group_default_origin(problem.key, found.group(1), choices, sources)
        if origin:
            group = problem.key.split(".")[0]
            problem = replace(problem, message=(
                f"{problem.message}. {problem.key} comes from {origin}, the {group} group's option "
                f"{choices.get(group)} (the default unless the recipe overrides it), whose keys stay under your "
                f"{group} when the recipe only sets {group}._target_: add `- override /{group}: null` to the "
                f"defaults list of recipe {recipe} (or add ~{group} to the command line), so the {group} node holds "
                "only what the recipe sets"))
        problems.append(problem)
    return ConfigError(problems) if problems != err.problems else err


def without_run_dir_files(cfg: DictConfig) -> None:
    """A debug run (trainer.fast_dev_run) writes nothing but its log: a path that a factory would save into inside
    the run dir (`${runner.in_run_dir:tokenizer}`, the text recipes' trained tokenizer) becomes null."""
    def paths(node, prefix: str = "") -> list[str]:
        if isinstance(node, dict):
            return [key for name, value in node.items() for key in paths(value, f"{prefix}{name}.")]
        return [prefix.rstrip(".")] if isinstance(node, str) and "${runner.in_run_dir:" in node else []

    for key in paths(OmegaConf.to_container(cfg, resolve=False)):
        OmegaConf.update(cfg, key, None, force_add=False)


def interpolation_sources(node, prefix: str = "") -> dict[str, str]:
    """{key: the key it copies} for every value that is exactly one `${other.key}` interpolation."""
    found = {}
    if isinstance(node, dict):
        for name, value in node.items():
            found.update(interpolation_sources(value, f"{prefix}{name}."))
    elif isinstance(node, str) and node.startswith("${") and node.endswith("}") and node.count("${") == 1 \
            and ":" not in node:
        found[prefix.rstrip(".")] = node[2:-1]
    return found
