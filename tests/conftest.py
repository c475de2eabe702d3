"""Shared test helpers: run the real CLI in a subprocess and read back what it left in the run dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# How long a test waits for something another process does (a checkpoint, a marker file, a process ending) before
# it fails: generous, so a loaded machine still gets there (beside CPU burners, load average 5.5-9.3 on 2 cores,
# tests/stress.sh: only a Ray cluster's start-up needed more, tests/launch/test_ray.py); a correct run never waits the
# whole of it.
WAIT_S = 300.0

# A tiny but real default run: the generated reverse task with few rows, a couple of optimizer steps.
TINY = ("data.num_train=256", "data.num_validation=64", "trainer.batch_size=32", "trainer.progress_bar=false")


# The files that take longest (module fixtures that launch many processes, 2-process runs), longest first as a full
# run measured them (--durations=0, summed per file; 2026-12-07, 779 tests). They run
# first: with `-n 3 --dist loadfile` each file runs whole on one worker, and the suite ends when the busiest worker
# does, so a slow file handed out last would leave the other workers idle for minutes. xdist's own order (most tests
# first) is switched off in pyproject.toml (--no-loadscope-reorder) so that this one holds; every other file follows
# in collection order.
SLOW_FILES = ("test_nlp_examples.py", "test_benchmarks.py", "test_multiprocess_cli.py", "test_ray.py", "test_resume.py",
              "test_docs.py", "test_recipe_matrix.py", "test_object_storage.py", "test_faults.py", "test_sweep.py",
              "test_launch_script.py", "test_resume_world_size.py", "test_accelerate_scripts.py", "test_engines.py",
              "test_golden.py", "test_bad_input.py", "test_stop_in_eval.py", "test_accelerator.py", "test_parallel.py",
              "test_run_end.py", "test_packaging.py", "test_cli_zygote.py", "test_cli.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


@pytest.fixture(scope="session", autouse=True)
def isolated_hf_cache(tmp_path_factory):
    """Generated datasets are cached per test session, never in the user's ~/.cache."""
    cache = tmp_path_factory.mktemp("hf_datasets_cache")
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    # This machine's own defaults (python -m runner machine) must not leak into the tests: an empty config home.
    os.environ["RUNNER_CONFIG_HOME"] = str(tmp_path_factory.mktemp("runner_config_home"))
    # The measured CPU peak (runner/distributed/peak.py) is cached per session, not in the user's ~/.cache/runner.
    os.environ["RUNNER_CACHE_HOME"] = str(tmp_path_factory.mktemp("runner_cache_home"))
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    # One thread per subprocess: the tests start many (2 ranks, a CLI run beside the test's own) on a few cores,
    # and torch's default of one thread per core would have them fight over each core.
    os.environ["OMP_NUM_THREADS"] = "1"
    return cache


def wait_for(predicate, what: str, timeout: float = WAIT_S, poll_s: float = 0.05):
    """Poll predicate() until it returns something truthy, and return that; past `timeout` seconds fail with an
    AssertionError that says what was awaited. The deadline is for a machine that is stuck, not slow."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}; it never happened")
        time.sleep(poll_s)


class PipeReader:
    """A process's stdout and stderr (each a pipe, or None) read in threads as it runs, so that a test can wait on
    something else meanwhile: a pipe left unread fills at 64 KiB and stalls its writer. `text()` is what came so
    far (for a failure message); `join()` all of it once the process has ended."""

    def __init__(self, process: subprocess.Popen):
        self.parts = {"stdout": [], "stderr": []}
        self.threads = [threading.Thread(target=lambda stream=stream, part=part: part.extend(stream), daemon=True)
                        for name, part in self.parts.items() if (stream := getattr(process, name)) is not None]
        for thread in self.threads:
            thread.start()

    def text(self, last: int = 3000) -> str:
        return "".join([*self.parts["stdout"], *self.parts["stderr"]])[-last:]

    def join(self) -> tuple[str, str]:
        for thread in self.threads:
            thread.join(timeout=30)
        return "".join(self.parts["stdout"]), "".join(self.parts["stderr"])


def communicate_all(processes: list[subprocess.Popen], timeout: float = WAIT_S) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of processes that may wait on each other (the ranks or machines of one group),
    all their pipes read while they run: waiting on one while another's unread pipe fills would stall that one, and
    the whole group with it. `timeout` is for a stuck group, not a slow one: past it the processes are killed (not
    their children), so that they do not hold their ports for the rest of the suite."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:
            outputs = list(pool.map(lambda process: process.communicate(timeout=timeout), processes))
    except BaseException:
        for process in processes:
            process.kill()
        raise
    return [(process.returncode, out, err) for process, (out, err) in zip(processes, outputs)]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    cwd: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def run_dirs(self) -> list[Path]:
        return run_dirs_under(self.cwd)

    def run_dir(self) -> Path:
        dirs = self.run_dirs()
        assert len(dirs) == 1, f"expected one run dir, found {dirs}\n{self.output}"
        return dirs[0]


def run_dirs_under(cwd: Path) -> list[Path]:
    """Run dirs (single runs and sweep jobs) under cwd/outputs: a config.yaml next to .hydra/ (checkpoints and
    export/ hold copies of config.yaml too), oldest first."""
    return sorted(path.parent for path in (Path(cwd) / "outputs").rglob("config.yaml")
                  if ".hydra" not in path.parts and (path.parent / ".hydra").is_dir())


ZYGOTES: list = []  # cli_zygote.Zygote, one per environment the runs asked for (at most MAX_ZYGOTES)
MAX_ZYGOTES = 3  # the tests' own environment, with tests/ on PYTHONPATH, and one more


def _zygote_for(env: dict):
    """A zygote serving this environment: the first one that does, or a new one while there are fewer than
    MAX_ZYGOTES; None (run a process) when there is none or it cannot start."""
    import cli_zygote

    for zygote in ZYGOTES:
        if zygote.serves(env):
            return zygote
    if len(ZYGOTES) >= MAX_ZYGOTES or os.environ.get("RUNNER_TEST_ZYGOTE") == "0":
        return None
    try:
        ZYGOTES.append(cli_zygote.Zygote(env))
    except OSError:
        return None
    return ZYGOTES[-1]


@pytest.fixture(scope="session", autouse=True)
def close_zygotes():
    yield
    while ZYGOTES:
        ZYGOTES.pop().close()


def cli_env(env: dict | None = None) -> dict:
    """The environment a CLI run gets: this process's, unbuffered output, and `env` on top."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_cli(*overrides: str, cwd: Path, env: dict | None = None, timeout: float = 600, args: tuple = ()) -> CliResult:
    """`python -m runner OVERRIDES` in cwd, as a user would type it: a process forked from a zygote that imported
    torch, datasets and Hydra already (tests/cli_zygote.py), or, with Python flags (`args`) or when no zygote serves
    the environment, a new interpreter. RUNNER_TEST_ZYGOTE=0 makes every run a new interpreter."""
    full_env = cli_env(env)
    zygote = None if args else _zygote_for(full_env)
    ran = zygote.run(list(overrides), str(cwd), full_env, timeout) if zygote is not None else None
    if ran is not None:
        return CliResult(*ran, Path(cwd))
    proc = subprocess.run(
        [sys.executable, *args, "-m", "runner", *overrides],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr, Path(cwd))


def run_in_process(*overrides: str, cwd: Path, capsys) -> CliResult:
    """runner.commands.cli.main(OVERRIDES) in this process, in cwd, as `python -m runner OVERRIDES` would run there (the
    working directory importable), without the seconds a new process spends importing torch, Hydra and datasets.
    What it printed and logged is captured by capsys; a SystemExit's code is the returncode, as it would be the
    process's exit status. For what only a process shows (a signal, several ranks, start-up) use run_cli."""
    from runner.commands.cli import main

    cwd = Path(cwd)
    code = 0
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.syspath_prepend(str(cwd))
        capsys.readouterr()
        try:
            main(list(overrides))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:  # the user's modules it imported from cwd: the next test's cwd has its own
            for name in set(sys.modules) - before:
                if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(cwd)):
                    del sys.modules[name]
    printed = capsys.readouterr()
    return CliResult(code, printed.out, printed.err, cwd)


@pytest.fixture
def cli(tmp_path):
    """Call as cli(*overrides) to run the CLI in a fresh working directory."""

    def call(*overrides: str, **kwargs) -> CliResult:
        return run_cli(*overrides, cwd=kwargs.pop("cwd", tmp_path), **kwargs)

    return call


def read_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs of a TensorBoard scalar, read back from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def read_jsonl(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1 (for a rendezvous or a server a test starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
