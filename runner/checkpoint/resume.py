"""What `resume=` means, decided once in the parent process before any worker starts.

- `resume=auto`: the newest complete checkpoint in this run dir's `checkpoints/`; none yet: start from scratch
  (so one command line serves the first start and every requeue). Continue a run in place by passing its dir:
  `resume=auto hydra.run.dir=outputs/2026-12-01/10-00-00-000000`.
- `resume=<run dir>` or `resume=<run dir>/checkpoints`: the newest complete checkpoint there.
- `resume=<run dir>/checkpoints/step_N`: exactly that checkpoint.
- `resume=<URL>` (s3://bucket/prefix, a `checkpoint.dir` another run wrote; its checkpoints/ folder; or one
  checkpoints/step_N in it): the newest intact committed checkpoint there, or exactly the one named, downloaded
  into `<run dir>/fetched/` and verified there like a local one. The run continues in its own run dir. Only the
  process that writes the run dir downloads; every rank takes its choice when the workers start.

Every candidate is verified (sizes and sha256 against its manifest). When the newest is damaged, the previous
complete one is taken, with a warning that names both; a named checkpoint that is damaged is refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

from runner.checkpoint import files, safe_dcp
from runner.checkpoint.remote import Storage, split_resume_url
from runner.errors import CheckpointError, ConfigError, NoIntactCheckpoint, ResumeRefused

log = logging.getLogger(__name__)

AUTO = "auto"
# Where resume=<URL> downloads its checkpoint: beside the run's own checkpoints/, which resume=auto and retention
# manage, so a fetched checkpoint is never taken for one this run wrote.
FETCHED = "fetched"


def find_resume(resume: str | None, run_dir: Path, verify: bool = True,
                storage: Storage | None = None, fetch: bool = True) -> Path | None:
    """The checkpoint to resume from, or None to start from scratch. Raises CheckpointError when none is usable,
    or when the chosen one holds pickled code (checked here, in the parent, before any worker starts). With
    `storage` (checkpoint.dir), resume=auto first fetches its newest intact committed checkpoint into the run dir,
    and a fresh start refuses a storage that holds another run's checkpoints. `fetch`: whether this process
    downloads what resume=<URL> names (the run dir's writer does; the others return None and take its choice when
    the workers start)."""
    if storage is not None and not resume and storage.committed():
        raise ConfigError("checkpoint.dir", f"is {storage}, which already holds the checkpoints of a run; continue "
                                            "it with resume=auto, or choose another checkpoint.dir for a new run")
    if storage is not None and resume == AUTO:
        fetched = storage.fetch_newest(run_dir / "checkpoints", verify)
        if fetched is not None:
            log.info("resume=auto: %s/checkpoints/%s is the newest intact checkpoint there; fetched into %s",
                     storage, fetched.name, fetched.parent)
    if resume and "://" in resume:
        # Only the run dir's writer downloads; every rank takes its choice at start (runner/launch/worker.py).
        found = fetch_url(resume, run_dir / FETCHED, verify) if fetch else None
    else:
        found = _find_resume(resume, run_dir, verify)
    if found is not None:
        manifest = files.read_manifest(found)
        if manifest is not None and files.layout_of(manifest) is files.Layout.dcp:
            safe_dcp.read_metadata(found)
    return found


def _find_resume(resume: str | None, run_dir: Path, verify: bool) -> Path | None:
    if not resume:
        refuse_to_overwrite(run_dir)
        return None
    if resume == AUTO:
        found = newest_intact(run_dir / "checkpoints", verify)
        if found is None:
            refuse_to_overwrite(run_dir)
            log.info("resume=auto: no checkpoint in %s yet; starting from scratch", run_dir / "checkpoints")
        return found
    path = Path(resume).expanduser().resolve()
    if (path / files.MANIFEST).is_file() or path.name.startswith("step_"):
        reason = files.damage(path, verify) if path.is_dir() else f"{path} does not exist"
        reason = reason or nonfinite_reason(path)
        if reason:
            raise CheckpointError(f"resume: cannot load {path}: {reason}")
        return path
    source = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not source.is_dir() or not files.complete_checkpoints(source) and not _has_damaged(source):
        raise CheckpointError(
            f"resume: '{resume}' is neither a checkpoint nor a directory of checkpoints; give resume=auto, a run "
            "dir, its checkpoints/ directory, or one checkpoints/step_NNNNNNNN directory"
        )
    found = newest_intact(source, verify)
    if found is None:
        raise _none_intact(f"resume: every checkpoint in {source} is damaged (see the warnings above)")
    return found


def fetch_url(url: str, directory: Path, verify: bool = True) -> Path:
    """The checkpoint `resume=<URL>` names, downloaded into `directory` and verified: the newest intact one of a
    checkpoint.dir, or exactly the one named."""
    prefix, name = split_resume_url(url)
    storage = Storage(prefix, key="resume")
    storage.check_readable()
    found = storage.fetch(name, directory, verify) if name else storage.fetch_newest(directory, verify)
    if found is None:
        raise CheckpointError(f"resume: {url} holds no committed checkpoint (no {storage}/checkpoints/step_N/"
                              f"{files.MANIFEST}); give a checkpoint.dir a run wrote, its checkpoints/ folder, or "
                              "one checkpoints/step_N in it")
    log.info("resume=%s: %s/checkpoints/%s fetched into %s and verified", url, storage, found.name, found.parent)
    return found


def _none_intact(what: str) -> NoIntactCheckpoint:
    """resume=auto would meet the same damage again: say what can be done instead."""
    return NoIntactCheckpoint(f"{what}; no checkpoint here can be resumed: restore its files from a copy, or start a "
                              "new run in another run dir (without resume, or hydra.run.dir=NEW)")


def newest_intact(directory: Path, verify: bool = True) -> Path | None:
    """The newest checkpoint that passes verification; each damaged newer one is reported and skipped."""
    candidates = [path for path, _ in files.complete_checkpoints(directory)]
    skipped = []
    for path in reversed(candidates):
        reason = files.damage(path, verify)
        if reason is None and (nonfinite := nonfinite_reason(path)):
            log.warning("resume: passing over checkpoint %s: %s", path.name, nonfinite)
            skipped.append(f"{path.name}: {nonfinite}")
            continue
        if reason is None:
            if skipped:
                log.warning("resume: falling back to %s, the newest intact checkpoint (skipped: %s)",
                            path.name, "; ".join(skipped))
            return path
        log.warning("resume: checkpoint %s is damaged: %s", path.name, reason)
        skipped.append(f"{path.name}: {reason}")
    if skipped:
        raise _none_intact(f"resume: every checkpoint in {directory} is damaged: {'; '.join(skipped)}")
    return None


def nonfinite_reason(path: Path) -> str | None:
    """Why the checkpoint at `path` is not to be resumed from for NaN or inf in its weights, or None. The runner
    checks the weights and optimizer state before sealing and records "finite": true in the manifest. A
    checkpoint written before that check is taken as is: its files alone cannot tell a NaN-trained weight from a
    legitimate -inf buffer (an attention mask) saved beside the weights, and passing over a good checkpoint would
    throw away training; a non-finite one still stops at its first logged loss with trainer.on_nonfinite's
    message."""
    return files.nonfinite_in(files.read_manifest(path) or {})


def refuse_inexact_resume(path: Path, world_size: int, global_batch: int) -> None:
    """Decided in the parent, before any worker starts: a checkpoint continues on another number of processes only
    with the global batch it was written with. Its position is kept in samples of the epoch and each optimizer
    step's rows are dealt from one order of the epoch (runner/data/batches.py), so with the same global batch the
    steps after the resume take the same rows in the same order on 1, 2 or 4 processes, and the whole weights or
    the shards load onto any count. What depends on the layers (a per-process random draw, batch statistics) is
    checked where the model is built: runner/training/checkpointer.py, refuse_per_process_layers."""
    manifest = files.read_manifest(path)
    if manifest is None or manifest["world_size"] == world_size:
        return
    written = manifest["world_size"]
    if "global_batch" not in manifest:
        raise ResumeRefused(
            f"resume: {path} was written by a run with {written} process(es), before checkpoints recorded their "
            f"global position, and this run has {world_size}: it can continue exactly only with "
            f"hardware.num_processes={written}, or start a new run from its weights (checkpoint.init_from={path})")
    if manifest["global_batch"] != global_batch:
        raise ResumeRefused(
            f"resume: {path} was written with a global batch of {manifest['global_batch']} samples per optimizer "
            f"step on {written} process(es); this run has {world_size} and a global batch of {global_batch}, so "
            "its steps would take other rows and it cannot continue exactly. Set trainer.batch_size="
            f"{manifest['global_batch']} (the global batch; trainer.micro_batch_size caps what one device takes at "
            f"once) and leave trainer.per_device_batch_size null, or resume with hardware.num_processes={written}"
        )


def _has_damaged(directory: Path) -> bool:
    return any(path.is_dir() for path in directory.glob("step_*"))


def refuse_to_overwrite(run_dir: Path) -> None:
    """A fresh start must not write over another run's checkpoints and metrics in the same run dir."""
    if files.complete_checkpoints(run_dir / "checkpoints"):
        raise ConfigError(
            "resume",
            f"the run dir {run_dir} already holds a run with checkpoints; continue it with resume=auto, or "
            "choose another hydra.run.dir to start a new run",
        )
