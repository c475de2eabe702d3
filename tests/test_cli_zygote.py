"""tests/cli_zygote.py, which most CLI tests run through (conftest.run_cli): a run forked from it ends as the same
command in a new interpreter ends (exit status, output, run dir, the folder's own modules importable), a run past
its timeout is killed, and an environment the zygote was not started in is left to a new interpreter."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cli_zygote import Zygote
from conftest import TINY, cli_env, run_dirs_under

# The folder's own module, as `python -m runner` finds it (the working folder first on sys.path).
MODEL = '''import torch


class Tiny(torch.nn.Module):
    def __init__(self, vocab_size, **_):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab_size, 8), torch.nn.Linear(8, vocab_size)

    def forward(self, tokens):
        return self.head(self.embed(tokens))
'''
RUN = (*TINY, "trainer.max_steps=2", "model._target_=mymodel.Tiny", "allowed_targets=[runner.,torch.,mymodel.]")


def _same_text(output: str, cwd) -> str:
    """Output with what differs between any two runs (the folder, times, dates, run dir names, durations) blanked."""
    output = output.replace(str(cwd), "<cwd>")
    return re.sub(r"\d{4}-\d\d-\d\d[ /][\d:,/-]+|\d+\.\d+ s\b|\d+-\d+-\d+-\d+", "#", output)


@pytest.fixture(scope="module")
def zygote():
    started = Zygote(cli_env())
    yield started
    started.close()


@pytest.mark.parametrize("overrides", [RUN, ("trainer.max_steps=2", "nope=1")], ids=["trains", "refused"])
def test_a_forked_run_ends_as_a_new_interpreter_does(zygote, tmp_path, overrides):
    env = cli_env()
    ends = {}
    for how in ("warm-up", "zygote", "interpreter"):  # the warm-up's first uses (the datasets cache, the CPU peak)
        cwd = tmp_path / how
        cwd.mkdir()
        (cwd / "mymodel.py").write_text(MODEL)
        if how != "interpreter":
            code, out, err = zygote.run(list(overrides), str(cwd), env, timeout=300)
        else:
            done = subprocess.run([sys.executable, "-m", "runner", *overrides], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=300)
            code, out, err = done.returncode, done.stdout, done.stderr
        files = sorted(str(path.relative_to(run_dir)) for run_dir in run_dirs_under(cwd)
                       for path in run_dir.rglob("*") if path.is_file() and "tensorboard" not in path.parts)
        ends[how] = code, _same_text(out, cwd), _same_text(err, cwd), files
    assert ends["zygote"] == ends["interpreter"]
    assert ends["zygote"][0] == (0 if overrides == RUN else 1)
    if overrides == RUN:
        assert "checkpoints/step_00000002/manifest.json" in ends["zygote"][3], ends["zygote"][3]


def test_a_run_past_its_timeout_is_killed_and_the_next_runs(zygote, tmp_path):
    env = cli_env()
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([*TINY, "trainer.max_epochs=50"], str(tmp_path), env, timeout=0.5)
    code, _, err = zygote.run(["nope=1"], str(tmp_path), env, timeout=300)
    assert code == 1 and "nope: is not a setting" in err


def test_another_environment_is_not_served(zygote):
    env = cli_env()
    assert zygote.serves({**env, "PYTEST_CURRENT_TEST": "another test", "RUNNER_TEST_ROWS": "rows"})  # read by runs
    assert not zygote.serves({**env, "HF_HUB_OFFLINE": "1"})  # read when datasets is imported


def test_a_zygote_that_died_hands_its_runs_back(tmp_path):
    env = cli_env()
    zygote = Zygote(env)
    zygote.process.kill()
    zygote.process.wait()
    assert zygote.run(["nope=1"], str(tmp_path), env, timeout=300) is None  # conftest.run_cli then runs a process
    assert not zygote.serves(env)
    zygote.close()
