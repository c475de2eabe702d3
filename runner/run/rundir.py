"""The run dir a command may use, decided before anything is written into it; one run at a time in it; and, when a
run fails before training, the removal of exactly what this invocation created.

    absent        -> created here; a failure before training removes it (and the parents created with it)
    empty         -> a folder the user made; a failure removes only what this invocation put in it
    runner's own  -> an earlier run (resume=auto, a requeue, a re-run of a sweep job): nothing is ever removed
    anything else -> refused: it holds the user's own files

Plain Python, no Hydra: the CLI calls `inspect` with the run dir it is about to use.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from runner.errors import ConfigError, RunnerError

# What a runner run dir may hold before its config.yaml exists: Hydra's record, the lock of a run starting up,
# and the logs of an attempt that stopped early (a failed start, a SIGTERM during start-up).
EARLY_ENTRIES = (".hydra", ".runner.lock", ".runner.lock.holder")
LOCK_FILE = ".runner.lock"
HOLDER_FILE = ".runner.lock.holder"
STARTED_MARKERS = ("metrics.jsonl", "checkpoints", "tensorboard")


class RunDirState(str, Enum):
    absent = "absent"
    empty = "empty"
    runner = "runner"


@dataclass
class RunDir:
    """The run dir of one invocation and what was there before it: enough to undo only this invocation's files."""

    path: Path
    state: RunDirState
    created_parents: list[Path] = field(default_factory=list)
    """Ancestors that did not exist either (outputs/<date>/ of a first run): removed with it if left empty."""
    _lock: object = None

    @property
    def locked(self) -> bool:
        return self._lock is not None

    @property
    def training_started(self) -> bool:
        return any((self.path / name).exists() for name in STARTED_MARKERS)

    def remove_what_this_run_created(self, keep: tuple[Path, ...] = ()) -> None:
        """After a failure before training: drop what this invocation wrote, never what was there before, nor the
        files in `keep` (the log the error message points at). A process that does not own the run dir (machine 1
        of a shared dir) removes it only while no other run has taken it (no lock file in it)."""
        owner = self.locked
        self.unlock()
        if self.state is RunDirState.runner or not self.path.is_dir():
            return
        if not owner and (self.path / LOCK_FILE).exists():
            return
        kept = {Path(path).resolve() for path in keep if Path(path).exists()}
        if kept:
            _remove_all_but(self.path, kept)
            return
        if self.state is RunDirState.absent:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self.created_parents:  # innermost first
                try:
                    parent.rmdir()  # only while empty: another run may have started in it meanwhile
                except OSError:
                    break
            return
        for entry in self.path.iterdir():  # an empty folder the user made: everything in it is ours
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    # -- one run at a time ----------------------------------------------------------------------------------------

    def lock(self) -> None:
        """Hold an exclusive lock on the run dir for this process's lifetime (released by the OS even after
        kill -9). A second run or a requeue into the same dir while this one runs is refused, naming the holder."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.path / LOCK_FILE))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise RunnerError(
                f"the run dir {self.path} is in use by another run ({_holder(self.path)}); wait for it to end, or "
                "choose another hydra.run.dir"
            ) from None
        self._lock = lock
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            (self.path / HOLDER_FILE).write_text(json.dumps(holder), encoding="utf-8")
        except OSError:
            pass  # only informs the message another run would print

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            (self.path / HOLDER_FILE).unlink(missing_ok=True)


def _remove_all_but(folder: Path, kept: set[Path]) -> None:
    for entry in folder.iterdir():
        if entry.resolve() in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            if any(entry.resolve() in path.parents for path in kept):
                _remove_all_but(entry, kept)
            else:
                shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _holder(path: Path) -> str:
    try:
        holder = json.loads((path / HOLDER_FILE).read_text(encoding="utf-8"))
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError):
        return "its holder did not say who it is"


def is_runner_run_dir(path: Path) -> bool:
    """A folder an earlier runner invocation made: its config.yaml next to Hydra's .hydra/, or only the
    bookkeeping of an attempt that stopped before writing config.yaml."""
    names = {entry.name for entry in path.iterdir()}
    if ".hydra" in names and "config.yaml" in names:
        return True
    return all(name in EARLY_ENTRIES or _is_log(name) for name in names)


def _is_log(name: str) -> bool:
    return name.startswith("runner") and name.endswith(".log")


def inspect(path: Path, key: str = "hydra.run.dir") -> RunDir:
    """What `path` is before this invocation writes anything. Refuses a folder that holds files of the user's own
    and one that cannot be created or written."""
    path = path.resolve()
    if not path.exists():
        missing = [parent for parent in path.parents if not parent.exists()]
        try:
            path.mkdir(parents=True)
        except FileExistsError:  # another rank (torchrun) or a concurrent run made it a moment ago
            return inspect(path, key)
        except OSError as err:
            raise ConfigError(key, f"cannot create the run dir {path} ({err.strerror}); choose a folder you can "
                                   "write, e.g. hydra.run.dir=outputs/my-experiment") from None
        return RunDir(path, RunDirState.absent, created_parents=missing)
    if not path.is_dir():
        raise ConfigError(key, f"{path} is a file, not a folder; choose a folder for the run's outputs")
    _require_writable(path, key)
    if not any(path.iterdir()):
        return RunDir(path, RunDirState.empty)
    if is_runner_run_dir(path):
        return RunDir(path, RunDirState.runner)
    shown = sorted(entry.name for entry in path.iterdir())
    listing = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
    raise ConfigError(
        key,
        f"{path} already holds files that are not a runner run ({listing}); a run writes its config, logs, "
        "checkpoints and metrics into its run dir, so it starts only in a new or empty folder, or in an earlier "
        "run's dir (with resume=auto). Choose another hydra.run.dir, e.g. outputs/my-experiment",
    )


def _require_writable(path: Path, key: str) -> None:
    """Try it: permission bits do not tell (root ignores them; a read-only mount does not)."""
    probe = path / f".runner-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(key, f"cannot write into the run dir {path} ({err.strerror}); choose a folder you can "
                               "write, e.g. hydra.run.dir=outputs/my-experiment") from None
