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
