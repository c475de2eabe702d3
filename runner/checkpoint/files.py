"""One checkpoint directory on disk: atomic write, manifest, verification, listing, deletion.

    checkpoints/
      step_00000120/        one complete checkpoint
        model.safetensors   weights (safe to load: no code runs)
        state.pt            optimizer, scheduler, scaler, loop position, RNG (torch.load(weights_only=True))
        config.yaml         the resolved config that produced it
        manifest.json       written last: step, epoch, position, world size, layout, config hash, each file's
                            size and the sha256 of each of its 64 MiB blocks
      latest                the name of the newest complete checkpoint

That is the `safetensors` layout, written by rank 0 alone. In the `dcp` layout (parallel=fsdp) every rank writes
its shards of the weights and optimizer state (torch.distributed.checkpoint: `.metadata`, `__<rank>_0.distcp`)
into the same `.partial-step_N/`, and state.pt holds the rest; the manifest covers every file either way.

Files are written into `.partial-step_N/`, fsynced, hashed, the manifest written and fsynced last, then the
directory is renamed into place and the parent fsynced; only then does `latest` move (itself written to a
temporary name and renamed). A crash at any moment leaves every earlier checkpoint untouched, and a directory
without a valid manifest is never treated as a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError

from runner.errors import write_error
from runner.ground import write_text_atomically

# What a checkpoint writer raises when a file cannot be written: torch.save raises RuntimeError and safetensors its
# own SafetensorError (neither an OSError) on a full disk.
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT_VERSION = 1
PARTIAL_PREFIX = ".partial-"
TRASH_PREFIX = ".trash-"
_CHUNK = 8 * 2**20
BLOCK = 64 * 2**20  # files are hashed in blocks of this size, in parallel


class Layout(str, Enum):
    safetensors = "safetensors"
    """rank 0 writes the whole model (model.safetensors) and the rest (state.pt)."""
    dcp = "dcp"
    """every rank writes its shards of the model and optimizer (torch.distributed.checkpoint); rank 0 the rest."""


def layout_of(manifest: dict) -> Layout:
    # Checkpoints written before the manifest recorded a layout are all safetensors ones.
    return Layout(manifest.get("layout", Layout.safetensors.value))


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def partial_path(directory: Path, name: str) -> Path:
    """Where a checkpoint is written before it is sealed and renamed to `directory/name`."""
    return directory / f"{PARTIAL_PREFIX}{name}"


def start_partial(directory: Path, name: str) -> Path:
    """An empty `.partial-<name>/` (a leftover of an interrupted write of the same name is removed)."""
    partial = partial_path(directory, name)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    except OSError as err:
        raise _write_failure(directory / name, err) from err
    return partial


def write_files(directory: Path, name: str, writers: dict[str, Callable[[Path], None]], fresh: bool = True) -> None:
    """Each `writers[file](path)` writes one file into `.partial-<name>/` (`fresh`: a new one; else the one
    `start_partial` made, which the ranks' shards are in already): the part that must finish before training
    changes any tensor again. Any OSError (a full disk included) removes the partial directory and raises a
    WriteError (DiskFull for ENOSPC/EDQUOT); earlier checkpoints and `latest` are untouched."""
    partial = start_partial(directory, name) if fresh else partial_path(directory, name)
    try:
        for file_name, write in writers.items():
            write(partial / file_name)
    except WRITE_ERRORS as err:
        failure = _write_failure(directory / name, err)  # before the partial files free their space again
        shutil.rmtree(partial, ignore_errors=True)
        raise failure from err


def seal(directory: Path, name: str, manifest: dict, pointer: bool = True) -> Path:
    """Hash and fsync the written files, write the manifest last, rename the directory into place, fsync the
    parent, move `latest` (`pointer`). Touches nothing the training uses, so it may run in a background thread."""
    final = directory / name
    partial = directory / f"{PARTIAL_PREFIX}{name}"
    try:
        files = _hash_and_flush(sorted(path for path in partial.iterdir()))
        manifest_path = partial / MANIFEST  # in place: the directory itself is renamed into place
        write_text_atomically(manifest_path, json.dumps({"format": FORMAT_VERSION, **manifest, "files": files},
                                                        indent=1), temporary=manifest_path)
        fsync_path(partial)
        _replace_dir(partial, final)
        fsync_path(directory)
        if pointer:
            write_pointer(directory, name)
    except OSError as err:
        failure = _write_failure(final, err)
        shutil.rmtree(partial, ignore_errors=True)
        raise failure from err
    return final


def _hash_and_flush(paths: list[Path]) -> dict[str, dict]:
    """Block hashes (every core) and fsync of every file, in threads: hashing (CPU, from the page cache) overlaps
    the wait for the disk, and both release the GIL."""
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        flushed = [pool.submit(fsync_path, path) for path in paths]
        digests = block_digests(paths)
        for future in flushed:
            future.result()
    return {path.name: {"size": path.stat().st_size, "sha256": digests[path]} for path in paths}


def _offsets(path: Path) -> range:
    return range(0, max(path.stat().st_size, 1), BLOCK)


def _replace_dir(partial: Path, final: Path) -> None:
    """rename(2) cannot replace a non-empty directory: move an old one (same step, e.g. a damaged copy) aside."""
    if final.exists():
        trash = final.with_name(f"{TRASH_PREFIX}{final.name}")
        shutil.rmtree(trash, ignore_errors=True)
        (final / MANIFEST).unlink(missing_ok=True)  # from here on it is incomplete, never loaded by mistake
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(partial, final)


def write_pointer(directory: Path, name: str) -> None:
    write_text_atomically(directory / LATEST, name, temporary=directory / f"{PARTIAL_PREFIX}{LATEST}")


def _write_failure(final: Path, err: Exception):
    """The error for a checkpoint write that failed; its partial files are gone, earlier checkpoints untouched."""
    number = final.name.split("_")[-1]
    what = f"checkpoint step {int(number)}" if final.name.startswith("step_") and number.isdigit() else "the state"
    failure = write_error(err, final, what)
    failure.args = (f"{failure} (its partial files were removed; earlier checkpoints are untouched)",)
    return failure


def block_digests(paths: list[Path]) -> dict[Path, list[str]]:
    """sha256 of each BLOCK-byte block of each file, hashed in parallel (one block per task), so checking a large
    checkpoint uses every core instead of one."""
    tasks = [(path, offset) for path in paths for offset in _offsets(path)]
    with ThreadPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1)) as pool:
        hashed = list(pool.map(lambda task: _block_sha256(*task), tasks))
    digests: dict[Path, list[str]] = {path: [] for path in paths}
    for (path, _), digest in zip(tasks, hashed):
        digests[path].append(digest)
    return digests


def _block_sha256(path: Path, offset: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        handle.seek(offset)
        remaining = BLOCK
        while remaining and (chunk := handle.read(min(_CHUNK, remaining))):
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def write_speed(directory: Path, size: int) -> float:
    """Bytes per second of writing `size` bytes into `directory` and fsyncing them, as a checkpoint's files are
    (one probe file, removed after). For `runner plan`'s save-time figure: a save must fit an eviction's grace period."""
    import time

    probe = directory / f".runner-write-probe-{os.getpid()}"
    block = os.urandom(min(size, 1 << 20))
    started = time.perf_counter()
    try:
        with open(probe, "wb") as handle:
            for offset in range(0, size, len(block)):
                handle.write(block[:size - offset])
            handle.flush()
            os.fsync(handle.fileno())
        elapsed = time.perf_counter() - started
    finally:
        probe.unlink(missing_ok=True)
    return size / max(elapsed, 1e-9)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_pointer(directory: Path) -> str | None:
    pointer = directory / LATEST
    return pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else None


def read_manifest(path: Path) -> dict | None:
    """The checkpoint's manifest, or None when it has none (incomplete) or it cannot be parsed."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "files" in manifest and "step" in manifest else None


def nonfinite_in(manifest: dict) -> str | None:
    """Why a checkpoint is passed over for NaN or inf in its weights, from its manifest (see
    runner.checkpoint.resume.nonfinite_reason), or None."""
    return None if manifest.get("finite", True) else "its manifest says its weights hold NaN or inf"


def damage(path: Path, check_hashes: bool = True) -> str | None:
    """Why the checkpoint at `path` cannot be trusted (no manifest, a file missing, truncated or altered), or None."""
    manifest = read_manifest(path)
    if manifest is None:
        return f"{path} has no valid {MANIFEST} (an incomplete or foreign directory)"
    for file_name, expected in manifest["files"].items():
        file_path = path / file_name
        if not file_path.is_file():
            return f"{file_path} is missing"
        size = file_path.stat().st_size
        if size != expected["size"]:
            return f"{file_path} has {size} bytes, the manifest says {expected['size']} (truncated or altered)"
    if check_hashes:
        digests = block_digests([path / name for name in manifest["files"]])
        for file_name, expected in manifest["files"].items():
            if digests[path / file_name] != expected["sha256"]:
                return f"{path / file_name} does not match its sha256 in the manifest (corrupted or altered)"
    return None


def complete_checkpoints(directory: Path) -> list[tuple[Path, dict]]:
    """(path, manifest) of every checkpoint with a manifest, oldest step first (contents not verified here)."""
    found = []
    if directory.is_dir():
        for path in directory.glob("step_*"):
            manifest = read_manifest(path) if path.is_dir() else None
            if manifest is not None:
                found.append((path, manifest))
    return sorted(found, key=lambda item: item[1]["step"])


def newest_complete_step(directory: Path) -> int | None:
    """The step of the newest checkpoint with a manifest (what `resume=auto` would try first), or None."""
    found = complete_checkpoints(directory)
    return found[-1][1]["step"] if found else None


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint: the manifest first, so a half-deleted directory is never taken for a complete one."""
    (path / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(directory: Path) -> list[Path]:
    """Partial writes and half-deleted directories left by a crash; removed before this run writes anything."""
    leftovers = [p for p in directory.glob(".*") if p.name.startswith((PARTIAL_PREFIX, TRASH_PREFIX))]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return leftovers


def copy_durably(source: Path, target: Path) -> None:
    """Copy a file under a temporary name, fsync, and rename it into place (exports are replaced atomically)."""
    temporary = target.with_name(f"{PARTIAL_PREFIX}{target.name}")
    try:
        shutil.copyfile(source, temporary)
        fsync_path(temporary)
        os.replace(temporary, target)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
