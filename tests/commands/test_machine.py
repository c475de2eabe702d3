"""Per-machine defaults (`python -m runner machine`): written from flags or answers, checked before they are
written, shown, and honoured by `python -m runner` and `python -m runner.launch` alike."""

from __future__ import annotations

import pytest

from runner.commands import machine
from runner.run.compose import load
from runner.errors import ConfigError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def test_flag_settings_are_read_by_every_entry_point(home, capsys):
    """`machine set` writes the flags to local/machine.yaml; every entry point reads it; the command line wins."""
    machine.main(["set", "hardware=multi_cpu", "hardware.num_processes=4", "precision=bf16", "gpu_ids=[0,1]"])
    written = (home / "local" / "machine.yaml").read_text()
    assert "  - override /hardware: multi_cpu\n  - override /precision: bf16\n" in written
    assert "resolves to: hardware=multi_cpu, 4 process(es) per machine" in capsys.readouterr().out
    spec = load([])  # what `python -m runner` and `python -m runner.launch` compose
    assert spec.hardware.processes_per_machine == 4 and spec.config.precision.kind.value == "bf16"
    assert spec.config.gpu_ids == [0, 1]
    assert load(["hardware.num_processes=2"]).hardware.processes_per_machine == 2  # the command line wins


def test_another_hardware_drops_the_keys_the_machine_file_wrote_for_its_own(home, tmp_path, monkeypatch, caplog):
    """docs/hardware.md's CPU example, then hardware=cpu on the command line: the file's num_processes=2 was
    written for multi_cpu, and was kept and refused ("cpu runs one process"). It goes, as a recipe's keys for a
    swapped group go; so does it when a recipe chooses another hardware, except a key the recipe sets itself."""
    import logging

    machine.main(["set", "hardware=multi_cpu", "hardware.num_processes=2"])
    with caplog.at_level(logging.INFO, logger="runner"):
        assert load(["hardware=cpu"]).hardware.processes_per_machine == 1
    assert ("hardware=cpu on the command line replaces the multi_cpu of this machine's defaults "
            "(local/machine.yaml): its hardware.num_processes (written for multi_cpu) is dropped") in caplog.text
    assert load([]).hardware.processes_per_machine == 2  # the file still holds for a run that keeps its choice
    assert load(["hardware=multi_cpu"]).hardware.processes_per_machine == 2
    with pytest.raises(ConfigError, match="cpu runs one process"):  # what the command line sets itself is kept
        load(["hardware=cpu", "hardware.num_processes=2"])

    (tmp_path / "recipes").mkdir()
    for name, body in (("single", ""), ("four", "hardware:\n  num_processes: 4\n")):
        (tmp_path / "recipes" / f"{name}.yaml").write_text(
            f"# @package _global_\ndefaults:\n  - override /hardware: {'cpu' if name == 'single' else 'multi_cpu'}\n"
            f"{body}")
    monkeypatch.chdir(tmp_path)
    assert load(["recipe=single"]).hardware.processes_per_machine == 1
    assert load(["recipe=four"]).hardware.processes_per_machine == 4


def test_interactive_answers_make_the_same_file(home):
    answers = iter(["multi_cpu", "2", "", "bf16", "2", "1", "10.0.0.1", ""])
    settings = machine.interview(read=lambda prompt: next(answers))
    assert settings == {"hardware": "multi_cpu", "hardware.num_processes": "2", "gpu_ids": "all", "precision": "bf16",
                        "hardware.num_machines": "2", "hardware.machine_rank": "1",
                        "hardware.main_process_ip": "10.0.0.1", "hardware.main_process_port": "29500"}
    machine.write(settings)
    hardware = load([]).hardware
    assert (hardware.num_machines, hardware.machine_rank, hardware.main_process_ip) == (2, 1, "10.0.0.1")


def test_a_setting_this_machine_cannot_run_is_refused(home):
    """Nothing is written to local/machine.yaml; a key that is not a machine setting is refused too."""
    with pytest.raises(ConfigError, match="hardware: gpu needs a CUDA GPU"):
        machine.write(machine.parse(["hardware=gpu"])) if not __import__("torch").cuda.is_available() else \
            pytest.skip("this machine has a GPU")
    assert not (home / "local" / "machine.yaml").exists()
    with pytest.raises(ConfigError, match="trainer.batch_size: is not a machine setting"):
        machine.parse(["trainer.batch_size=3"])


def test_show_and_clear(home, capsys):
    machine.main(["show"])
    assert "not written yet" in capsys.readouterr().out
    machine.main(["set", "hardware=multi_cpu"])
    machine.main(["clear"])
    assert not (home / "local" / "machine.yaml").exists()
    assert load([]).hardware.processes_per_machine == 1


def test_gpu_ids_this_machine_lacks_are_saved_with_a_warning(home, capsys):
    """A file written for another machine is kept, but says which GPUs are not here."""
    count = __import__("torch").cuda.device_count()
    machine.main(["set", f"gpu_ids=[{count},{count + 1}]"])
    captured = capsys.readouterr()
    assert load([]).config.gpu_ids == [count, count + 1]  # saved
    assert (f"warning: gpu_ids [{count},{count + 1}] name GPU(s) [{count}, {count + 1}] this machine does not have "
            f"(it has {count} CUDA GPU(s)); saved anyway") in captured.err
    machine.main(["set", "gpu_ids=all"])
    assert "warning" not in capsys.readouterr().err


def test_the_machines_precision_reaches_a_launched_script(home, tmp_path):
    """`runner machine set precision=bf16`, then `runner launch script.py`: the script's Accelerator() trains in
    bf16, as `accelerate config` + `accelerate launch` give it (ACCELERATE_MIXED_PRECISION); the command line wins."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    machine.main(["set", "precision=bf16"])
    script = tmp_path / "script.py"
    script.write_text("import sys\nfrom runner import Accelerator\n"
                      "open(sys.argv[1], 'w').write(Accelerator().mixed_precision)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for overrides, expected in (([], "bf16"), (["precision=fp32"], "no")):
        result = subprocess.run([sys.executable, "-m", "runner.launch", *overrides, str(script),
                                 str(tmp_path / "seen")], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "seen").read_text() == expected, overrides


def test_set_changes_the_settings_it_names_and_keeps_the_others(home, capsys):
    machine.main(["set", "hardware=multi_cpu", "hardware.num_processes=4", "gpu_ids=[0,1]"])
    machine.main(["set", "precision=bf16"])
    spec = load([])
    assert (spec.hardware.processes_per_machine, spec.config.gpu_ids) == (4, [0, 1])
    assert spec.config.precision.kind.value == "bf16" and spec.hardware.kind.value == "multi_cpu"
    machine.main(["set", "hardware.num_processes=2"])
    assert load([]).hardware.processes_per_machine == 2 and load([]).config.precision.kind.value == "bf16"
    capsys.readouterr()
    with pytest.raises(SystemExit) as nothing:  # `set` alone would otherwise have emptied the file
        machine.main(["set"])
    assert nothing.value.code == 1 and "machine set: names no setting" in capsys.readouterr().err
    assert load([]).hardware.processes_per_machine == 2


def test_a_file_set_cannot_read_is_named_and_kept(home, capsys):
    path = home / "local" / "machine.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("defaults:\n  - override /hardware: multi_cpu\n hardware: [\n")
    for argv in (["set", "precision=bf16"], ["show"]):
        with pytest.raises(SystemExit) as refused:
            machine.main(argv)
        err = capsys.readouterr().err
        assert refused.value.code == 1 and str(path) in err and "Traceback" not in err, err
    assert path.read_text() == "defaults:\n  - override /hardware: multi_cpu\n hardware: [\n"  # not written over


def test_init_without_a_terminal_says_so_and_writes_nothing(home, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("multi_cpu\n"))  # ends after the first answer
    with pytest.raises(SystemExit) as ended:
        machine.main(["init"])
    assert ended.value.code == 1
    assert "machine init: reads its answers from the terminal and its input ended" in capsys.readouterr().err
    assert not (home / "local" / "machine.yaml").exists()


def test_a_setting_without_a_value_says_so():
    """`runner machine set precision` (no =VALUE) said precision "is not a machine setting" before listing it."""
    with pytest.raises(ConfigError, match=r"precision: has no value: give precision=VALUE"):
        machine.parse(["precision"])
