"""This machine's defaults, like `accelerate config`: hardware kind, processes, gpu_ids, precision and the
multi-machine addresses, written once to a file that `python -m runner` and `python -m runner.launch` read.

    python -m runner machine                     # show the file and what it resolves to on this machine
    python -m runner machine init                # answer a few questions
    python -m runner machine set hardware=multi_gpu gpu_ids=[0,1] precision=bf16 hardware.num_processes=2
    python -m runner machine set precision=fp32  # changes that one; the file's other settings stay
    python -m runner machine clear

The file is `<config home>/local/machine.yaml`, the config home being $RUNNER_CONFIG_HOME or ~/.config/runner
(found through Hydra's search path by hydra_plugins/runner_searchpath). Outside any project, so nothing commits
it; a checkout's conf/local/machine.yaml, if there is one, is read first. A recipe's choices win over the file,
and the command line wins over both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runner.config.search_path import machine_file

GROUPS = ("hardware", "precision")  # chosen with `group=option`; every other setting is `key=value`
KEYS = ("gpu_ids", "hardware.num_processes", "hardware.threads_per_process", "hardware.start_method",
        "hardware.num_machines", "hardware.machine_rank", "hardware.main_process_ip", "hardware.main_process_port",
        "hardware.timeout_s", "hardware.max_restarts")
HEADER = ("# @package _global_\n# This machine's defaults, written by `python -m runner machine` (show, init, set, clear).\n"
          "# A recipe's choices win over them, and the command line wins over both.\n")


def render(settings: dict[str, str]) -> str:
    """The file for these settings ({"hardware": "multi_gpu", "gpu_ids": "[0,1]", "hardware.num_processes": "2"})."""
    import yaml

    choices = [f"  - override /{group}: {settings[group]}" for group in GROUPS if group in settings]
    values: dict = {}
    for key, text in settings.items():
        if key in GROUPS:
            continue
        node = values
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = yaml.safe_load(text)
    body = ("defaults:\n" + "\n".join(choices) + "\n") if choices else ""
    return HEADER + body + (yaml.safe_dump(values, sort_keys=False) if values else "")


def parse(arguments: list[str]) -> dict[str, str]:
    """`key=value` arguments, checked against what the file may hold."""
    from runner.errors import ConfigError, Problem

    settings, problems = {}, []
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if not equals and key in (*GROUPS, *KEYS):
            problems.append(Problem(key, f"has no value: give {key}=VALUE"))
            continue
        if not equals or key not in (*GROUPS, *KEYS):
            problems.append(Problem(key or argument, f"is not a machine setting; use {', '.join((*GROUPS, *KEYS))}"))
            continue
        settings[key] = value
    if problems:
        raise ConfigError(problems)
    return settings


def saved_settings() -> dict[str, str]:
    """The settings the file holds now, as `set` takes them (group=option, key=value); {} when there is no file. A
    file that is not what `machine` writes is refused, naming it, rather than written over."""
    import yaml

    from runner.errors import ConfigError
    from runner.ground import flatten

    path = machine_file()
    if not path.is_file():
        return {}
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        settings = {}
        for entry in saved.pop("defaults", None) or []:
            (choice, option), = entry.items()
            settings[choice.removeprefix("override /")] = str(option)
        for key, value in flatten(saved).items():  # each value as `set` takes it, text render() reads back
            settings[key] = yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()
    except (yaml.YAMLError, AttributeError, TypeError, ValueError) as err:
        raise ConfigError(str(path), f"cannot be read as this machine's settings ({type(err).__name__}); fix it, or "
                                     "remove it with `python -m runner machine clear` and set them again") from None
    unknown = [key for key in settings if key not in (*GROUPS, *KEYS)]
    if unknown:
        raise ConfigError(str(path), f"holds {', '.join(unknown)}, which are not machine settings; fix it, or remove "
                                     "it with `python -m runner machine clear` and set them again")
    return settings


def write(settings: dict[str, str]) -> Path:
    """Check the settings by composing a run with them (in a scratch config home), then write the file."""
    import tempfile

    from runner.run.compose import load

    text = render(settings)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "local").mkdir()
        (Path(scratch) / "local" / "machine.yaml").write_text(text)
        previous = os.environ.get("RUNNER_CONFIG_HOME")
        os.environ["RUNNER_CONFIG_HOME"] = scratch
        try:
            load([])  # a setting that does not compose, or this machine does not have, fails here
        finally:
            if previous is None:
                del os.environ["RUNNER_CONFIG_HOME"]
            else:
                os.environ["RUNNER_CONFIG_HOME"] = previous
    path = machine_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def missing_gpus(gpu_ids: str | None) -> str | None:
    """A warning when the gpu_ids being saved name GPUs this machine does not have: saved all the same (the file
    may be meant for another machine), but a run here would not find them."""
    if not gpu_ids or gpu_ids.strip() in ("all", "null", "[]"):
        return None
    import torch
    import yaml

    from runner.distributed.devices import parse_gpu_ids

    try:
        wanted = parse_gpu_ids(yaml.safe_load(gpu_ids)) or []
    except (ValueError, yaml.YAMLError):  # write() has refused it already
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    absent = [gpu for gpu in wanted if gpu >= count]
    if not absent:
        return None
    return (f"warning: gpu_ids {gpu_ids} name GPU(s) {absent} this machine does not have (it has {count} CUDA "
            f"GPU(s)); saved anyway, for a machine that has them: a run here with hardware=gpu or multi_gpu would "
            "refuse them")


def show() -> str:
    from runner.run.compose import load

    path = machine_file()
    where = f"{path}:\n{path.read_text()}" if path.is_file() else f"{path}: not written yet (`python -m runner machine init`)"
    hardware = load([]).hardware
    gpus = f", GPUs {','.join(hardware.physical_gpus)}" if hardware.physical_gpus else ""
    return (f"{where}\nresolves to: hardware={hardware.kind.value}, {hardware.processes_per_machine} process(es) "
            f"per machine on {hardware.num_machines} machine(s), device {hardware.device_type}{gpus}")


QUESTIONS = (
    ("hardware", "hardware (cpu, gpu, multi_gpu, multi_cpu, tpu, auto)", "auto"),
    ("hardware.num_processes", "processes on this machine (empty: one per GPU / 2 CPU processes)", ""),
    ("gpu_ids", "GPUs to use (all, or a list like [0,1])", "all"),
    ("precision", "precision (fp32, bf16, fp16, fp8)", "fp32"),
    ("hardware.num_machines", "machines in a run", "1"),
)


def interview(read=input) -> dict[str, str]:
    settings = {}
    for key, question, default in QUESTIONS:
        answer = read(f"{question} [{default}]: ").strip() or default
        if answer:
            settings[key] = answer
    if int(settings.get("hardware.num_machines", "1")) > 1:
        settings["hardware.machine_rank"] = read("this machine's rank (0 for the main one) [0]: ").strip() or "0"
        settings["hardware.main_process_ip"] = read("the main machine's address: ").strip()
        settings["hardware.main_process_port"] = read("a free port on it [29500]: ").strip() or "29500"
    return settings


def main(argv: list[str] | None = None) -> None:
    from runner.errors import ConfigError, RunnerError, exit_with

    arguments = sys.argv[1:] if argv is None else argv
    command, rest = (arguments[0], arguments[1:]) if arguments else ("show", [])
    try:
        if command == "show":
            print(show())
        elif command == "set":  # these settings changed, the file's others kept
            if not rest:
                raise ConfigError("machine set", f"names no setting; give key=value pairs among "
                                                 f"{', '.join((*GROUPS, *KEYS))}")
            settings = parse(rest)
            print(f"wrote {write({**saved_settings(), **settings})}\n{show()}")
            warning = missing_gpus(settings.get("gpu_ids"))
            if warning:
                print(warning, file=sys.stderr)
        elif command == "init":
            try:
                answers = interview()
            except EOFError:  # stdin closed or ended before the last answer
                raise ConfigError("machine init", "reads its answers from the terminal and its input ended before "
                                                  "the last question; nothing was written. Without a terminal, use "
                                                  "python -m runner machine set key=value ...") from None
            print(f"wrote {write(answers)}\n{show()}")
        elif command == "clear":
            existed = machine_file().is_file()
            machine_file().unlink(missing_ok=True)
            print(f"removed {machine_file()}" if existed else f"{machine_file()} was not there; nothing to remove")
        else:
            print(f"usage: python -m runner machine [show | init | set key=value ... | clear]\n{__doc__}",
                  file=sys.stderr)
            raise SystemExit(2)
    except RunnerError as err:
        exit_with(err)


if __name__ == "__main__":
    main()
