"""The documentation runs as written: every python/bash block in docs/*.md is run here or says why it cannot be.

A block is marked by an HTML comment on the line before its fence (mkdocs does not render it):

    <!-- run -->                 run as written, in an empty folder (bash: `bash -e`; python: a fresh interpreter)
    <!-- run: fast -->           the same, with `debug=fast` after every `python -m runner` training command
    <!-- run: cfg -->            every `python -m runner` / `runner` run command only composes (`--cfg job` after
                                 it: the overrides exist and fit; a sweep, `-m`, as its first job: tests/sweep runs
                                 sweeps); other lines run as written
    <!-- run: cfg by=tests/x.py -->  a block whose commands tests/x.py runs for real (every `key=value` of them is
                                 written there): each command only composes, torchrun's too
    <!-- run: setup=toy -->      a python block that continues `SETUPS["toy"]` (a model, an optimizer, data)
    <!-- run: setup=toy check=plain -->   ... and is then checked by `CHECKS["plain"]` (what the page says of it)
    <!-- skip: REASON -->        not run here; REASON is one of SKIP_REASONS

A python or bash block with neither fails the test, so a new example is either run or says why not. The README is
held to its length limit, and each of its links into the docs must name a page that exists. The tables that name
what is in conf/ (recipes, groups, hardware) are checked against conf/.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, read_scalars, run_in_process

DOCS = ROOT / "docs"
README_LIMIT = 15_000

SKIP_REASONS = {
    "gpu": "needs a CUDA device (tests/gpu runs these where there is one)",
    "slurm": "needs a SLURM cluster",
    "machines": "needs several machines",
    "hub": "needs the Hugging Face Hub online",
    "install": "installs packages into the environment (CI runs the README's install and test commands)",
    "long": "a whole training run or benchmark of minutes; its figure is on the Benchmarks page with its command",
    "your-files": "needs your own files (a table, a text corpus, a model class, a finished run's directory)",
    "fragment": "a line to adapt (placeholders such as `...` or `<run dir>`), not a command",
}

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*(run|skip)\s*(?::\s*(.*?))?\s*-->\s*\n\s*\Z")

SETUPS = {
    "toy": '''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from runner import Accelerator

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
data = loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=8)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
plain = __import__("copy").deepcopy(model)
''',
}

# Run after a block: what the page claims about it.
CHECKS = {
    # "this loop gives bitwise the same parameters as the plain PyTorch loop"
    "plain": '''
plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
for source, targets in DataLoader(data.dataset, batch_size=8):
    plain_optimizer.zero_grad()
    F.cross_entropy(plain(source), targets).backward()
    plain_optimizer.step()
assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters())), "not bitwise the plain loop"
''',
}

RESIDUAL_MLP = '''import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, in_features: int, out_features: int, width: int = 32):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(in_features, width), nn.Linear(width, width), nn.Linear(width, out_features)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(h + torch.relu(self.hidden(h)))
'''


def _blocks():
    """(page, language, code, kind, option) for every fenced block of every page."""
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in FENCE.finditer(text):
            marker = MARKER.search(text[:match.start()])
            kind, option = (marker.group(1), marker.group(2) or "") if marker else (None, "")
            line = text[:match.start()].count("\n") + 1
            yield f"{page.name}:{line}", match.group(1), match.group(2), kind, option


BLOCKS = [block for block in _blocks() if block[1] in ("python", "bash")]
RUN = [block for block in BLOCKS if block[3] == "run"]


def test_every_python_and_bash_block_is_marked():
    unmarked = [where for where, _, _, kind, _ in BLOCKS if kind is None]
    assert not unmarked, f"mark these blocks <!-- run --> or <!-- skip: REASON -->: {unmarked}"
    bad = [(where, option) for where, _, _, kind, option in BLOCKS if kind == "skip" and option not in SKIP_REASONS]
    assert not bad, f"skip reasons must be one of {sorted(SKIP_REASONS)}: {bad}"
    assert len(RUN) >= 10  # the runnable examples exist (a broken marker regex would make this test vacuous)


RUN_COMMAND = re.compile(r"(python -m |torchrun .*-m )?runner(?!\.)(?! (plan|recipes|launch|machine|sample|env)\b)(?!.*--cfg\b)(\s|$)")


def _arguments(line: str) -> list[str]:
    """The words after `runner` on a run command's line."""
    return line.split("runner", 1)[1].split()


def _first_job(line: str) -> str:
    """`python -m runner` with the first job of the line's command: a sweep's first value of each swept key (Hydra's
    own parser splits them), no `-m`; under torchrun, the command each of its processes runs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, first = OverridesParser.create(), []
    for word in _arguments(line):
        override = None if word == "-m" else parser.parse_override(word)
        if override is not None and override.is_sweep_override():
            word = shlex.quote(f"{override.get_key_element()}={next(override.sweep_string_iterator())}")
        if override is not None:
            first.append(word)  # as written, unless swept
    return " ".join(["python -m runner", *first])


def _command_overrides(code: str) -> list[str]:
    """Every `key=value` word of the block's run commands, as written (comments dropped)."""
    lines = [re.sub(r"\s+#\s.*$", "", line) for line in re.sub(r"\\\n\s*", " ", code).splitlines()]
    return [word for line in lines if RUN_COMMAND.match(line) for word in _arguments(line) if "=" in word]


def _shorten(code: str, mode: str) -> str:
    """After every run command (`python -m runner`, `runner` or `torchrun ... -m runner` with overrides; not a
    subcommand or --cfg):
    `debug=fast` (mode fast) or `--cfg job` (mode cfg, a sweep's `-m` as its first job: Hydra refuses --cfg with
    -m). In mode "by" torchrun's command too is its first job."""
    out = []
    for line in re.sub(r"\\\n\s*", " ", code).splitlines():
        if RUN_COMMAND.match(line):
            line = re.sub(r"\s+#\s.*$", "", line)
            sweep = "-m" in _arguments(line)
            if mode == "by" or (mode == "cfg" and sweep and not line.startswith("torchrun")):
                line = _first_job(line)  # no -m left: composed with --cfg job below
            words = "debug=fast" if mode == "fast" else "--cfg job"
            if words not in line:
                line += " " + words
        out.append(line)
    return "\n".join(out) + "\n"


# Prepended to a bash block in mode cfg: `python -m runner ... --cfg job` and `runner ... --cfg job` are not started
# as processes (each would spend seconds importing torch and Hydra to print a config) but recorded, one file per
# command holding its arguments as bash expanded them (NUL-separated), and composed after the block in this process
# by runner.commands.cli.main, the function both commands call. Every other line (`runner plan`, `python -m
# runner.commands.env`, torchrun) runs as written.
RECORD_COMPOSE = r'''
_runner_compose_record() {
    _runner_compose_n=$(( ${_runner_compose_n:-0} + 1 ))
    printf '%s\0' "$@" > "$RUNNER_COMPOSE_DIR/$(printf %04d "$_runner_compose_n")"
}
_runner_composes_only() { [ "$#" -ge 2 ] && [ "${@: -2:1}" = "--cfg" ] && [ "${@: -1}" = "job" ]; }
python() {
    if [ "${1-}" = "-m" ] && [ "${2-}" = "runner" ] && _runner_composes_only "$@"; then
        shift 2; _runner_compose_record "$@"
    else command python "$@"; fi
}
runner() {
    case "${1-}" in launch|machine|plan|recipes|sample|env) command runner "$@"; return;; esac
    if _runner_composes_only "$@"; then _runner_compose_record "$@"; else command runner "$@"; fi
}
'''


def _compose_recorded(folder: Path, cwd: Path, env: dict, where: str) -> int:
    """Each recorded `--cfg job` command through runner.commands.cli.main, in cwd with the environment the block started
    with (no cfg block exports a variable of its own), as the process would have run it; a command that fails
    fails the test with its output. Returns how many ran."""
    from hydra.core.global_hydra import GlobalHydra

    from runner.commands.cli import main

    commands = [path.read_bytes().decode().split("\0")[:-1] for path in sorted(folder.iterdir())]
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for name in ("HF_HUB_OFFLINE", "RUNNER_CONFIG_HOME"):
                patch.setenv(name, env[name])
            patch.chdir(cwd)
            patch.syspath_prepend(str(cwd))  # what `python -m runner` and the `runner` script do for the cwd
            code = 0
            try:
                main(argv)
            except SystemExit as exit_:
                code = exit_.code
            finally:
                GlobalHydra.instance().clear()
        printed = out.getvalue()
        assert code in (0, None) and printed.strip(), \
            f"{where}: `runner {' '.join(argv)}` failed (exit {code}):\n{printed[-3000:]}\n{err.getvalue()[-3000:]}"
    return len(commands)


@pytest.mark.parametrize("where,language,code,kind,option", RUN, ids=[block[0] for block in RUN])
def test_block_runs(where, language, code, kind, option, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["RUNNER_CONFIG_HOME"] = str(tmp_path / "config-home")  # runner.commands.machine writes there, not into ~/.config
    options = dict(word.partition("=")[::2] for word in option.split())
    if "by" in options:  # the named test runs these commands; here they compose
        missing = [word for word in _command_overrides(code) if word not in (ROOT / options["by"]).read_text()]
        assert not missing, f"{where}: {options['by']} does not run {missing}; run the block here instead"
        code = _shorten(code, "by")
    elif "fast" in options or "cfg" in options:
        code = _shorten(code, "fast" if "fast" in options else "cfg")
    recorded = tmp_path.parent / f"{tmp_path.name}-composed"
    if language == "python":
        code = SETUPS.get(options.get("setup"), "") + code + CHECKS.get(options.get("check"), "")
        command = [sys.executable, "-c", code]
    else:
        preamble = ""
        if "cfg" in options:
            recorded.mkdir()
            env["RUNNER_COMPOSE_DIR"] = str(recorded)
            preamble = RECORD_COMPOSE
        command = ["bash", "-e", "-o", "pipefail", "-c", preamble + code]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{where} failed:\n{code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if recorded.is_dir():
        lines = [re.sub(r"\s+#\s.*$", "", line) for line in code.splitlines()]
        expected = sum(1 for line in lines if line.endswith(" --cfg job") and not line.startswith("torchrun")
                       and RUN_COMMAND.match(line.removesuffix(" --cfg job")))
        assert _compose_recorded(recorded, tmp_path, env, where) == expected  # every such command was composed


def test_the_docs_recipe_runs_in_a_users_project(tmp_path, capsys):
    """docs/recipes.md's own recipe, with a model and a table of the shapes it names; run by runner.commands.cli.main in this
    process as `python -m runner` runs it in the user's project (its folder importable)."""
    pandas = pytest.importorskip("pandas")
    import numpy as np

    text = (DOCS / "recipes.md").read_text()
    section = text[text.index("## Writing your own recipe"):]
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "models.py").write_text(RESIDUAL_MLP)
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, 16)).astype("float32")
    table = pandas.DataFrame(features, columns=[f"f{i}" for i in range(16)])
    table["label"] = (features[:, :4].argmax(axis=1)).astype("int64")  # 4 classes
    table.to_parquet(tmp_path / "data" / "train.parquet")
    result = run_in_process("recipe=mine", "trainer.max_epochs=2", "trainer.progress_bar=false", cwd=tmp_path,
                            capsys=capsys)
    assert result.returncode == 0, result.output
    evaluations = read_scalars(result.run_dir(), "val/accuracy")
    assert [step for step, _ in evaluations] == [3, 6]  # 320 training rows / 128 = 3 steps an epoch
    assert evaluations[-1][1] > 0.3  # better than chance (0.25)


def test_readme_is_short_and_its_docs_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= README_LIMIT, f"README.md has {len(readme)} characters; the limit is {README_LIMIT}"
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to pages that do not exist: {missing}"
    nav = (ROOT / "mkdocs.yml").read_text()
    unlisted = [page.name for page in DOCS.glob("*.md") if page.name not in nav]
    assert not unlisted, f"pages missing from mkdocs.yml's nav: {unlisted}"


def test_the_readme_examples_are_the_pages_examples():
    """The README's blocks are copies of blocks on the pages, where they are run: a copy that drifts fails here."""
    readme = (ROOT / "README.md").read_text()
    pages = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    blocks = FENCE.findall(readme)
    assert len(blocks) >= 3
    drifted = [code for _, code in blocks if code not in pages]
    assert not drifted, f"README blocks that are on no page as written: {drifted}"


def _table_names(page: str, heading: str) -> set[str]:
    """The backquoted names in the first column of the first table after `heading` on a page."""
    text = (DOCS / page).read_text()
    table = text[text.index(heading):].split("\n\n| ", 1)[1].split("\n\n", 1)[0]
    return {re.match(r"`([^`]+)`", row.split("|")[1].strip()).group(1) for row in table.splitlines()[2:]}


def _conf(group: str) -> set[str]:
    return {path.stem for path in (ROOT / "conf" / group).glob("*.yaml")}


def test_the_recipe_table_lists_every_recipe():
    assert _table_names("recipes.md", "# Recipes and config groups") == _conf("recipe")


def test_the_group_table_lists_every_option():
    text = (DOCS / "recipes.md").read_text()
    rows = dict(re.findall(r"^\| `([\w/]+)` \| (.*) \|$", text, re.MULTILINE))
    for group in ("hardware", "parallel", "precision", "model", "optimizer", "scheduler", "data", "tokenizer",
                  "task", "hparams_search", "hydra/launcher", "logger", "callbacks", "debug"):
        listed = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", rows[group])))
        assert listed == _conf(group), (group, listed, _conf(group))


def test_the_hardware_table_lists_every_choice():
    assert _table_names("distributed.md", "**What each hardware choice does**") == _conf("hardware")


def test_every_python_m_command_in_the_docs_exists():
    """`python -m runner.X` and `python -m runner WORD` in the commands table and on the pages name a module users
    can run and a command the runner has."""
    import importlib.util

    from runner.commands.cli import COMMANDS

    text = (ROOT / "README.md").read_text() + "".join(page.read_text() for page in DOCS.glob("*.md"))
    modules = set(re.findall(r"python -m (runner(?:\.\w+)+)", text))
    assert "runner.launch" in modules
    # A package runs under -m only with a __main__ module.
    missing = [name for name in sorted(modules) if importlib.util.find_spec(name) is None
               or (importlib.util.find_spec(name).submodule_search_locations is not None
                   and importlib.util.find_spec(name + ".__main__") is None)]
    assert not missing, f"commands the docs name that do not exist: {missing}"
    words = set(re.findall(r"python -m runner ([a-z]+)(?=[\s`|])", text))
    assert {"machine", "sample", "env", "plan"} <= words
    assert words <= set(COMMANDS), f"commands the docs name that do not exist: {sorted(words - set(COMMANDS))}"
