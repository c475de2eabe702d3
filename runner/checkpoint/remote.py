"""Checkpoints and exports on object storage: `checkpoint.dir=s3://bucket/prefix` (or gs://, az://, any fsspec URL).

Object storage has no atomic rename, so there the manifest is the commit. Each checkpoint is first written and
sealed in the run dir as always (runner/checkpoint/files.py: every local guarantee holds), then uploaded:

1. every file of the manifest, the largest last (an object becomes visible only when its upload completes: a
   process killed in the middle leaves nothing of that file);
2. their sizes, read back from the storage, checked against the manifest;
3. manifest.json, last: a checkpoint exists on the storage when its manifest does.

A kill before step 3 leaves objects without a manifest: never listed as a checkpoint, never resumed, and removed
when the next run on that prefix starts writing. Retention deletes a manifest first and the rest after it, only
once the newer checkpoint is committed. Resuming downloads the newest committed checkpoint into the run dir and
verifies every sha256 there, like a local one (a damaged one is reported and the previous one fetched); the state
is read with weights_only, so nothing is unpickled.

Composer's RemoteUploaderDownloader and Ray Train's persistence to `storage_path` work the same way: write locally,
then upload. Credentials and endpoint come from the storage library's usual environment (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY or AWS_PROFILE, AWS_ENDPOINT_URL for an S3-compatible server).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from runner.checkpoint import files
from runner.errors import CheckpointError, ConfigError, first_line

log = logging.getLogger(__name__)

CHECKPOINTS, EXPORT = "checkpoints", "export"
# Which package gives fsspec each protocol, for the message when it is missing (pip install runner-ml[s3] etc.).
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
# What `resume=<URL>` takes (runner/checkpoint/resume.py), for the messages.
RESUME_FORMS = ("a checkpoint.dir URL (s3://bucket/prefix: its newest intact checkpoint), its checkpoints/ folder, "
                "or one checkpoints/step_N in it")


def split_resume_url(url: str) -> tuple[str, str | None]:
    """`resume=<URL>` as (the checkpoint.dir URL it names, the checkpoint's name, or None for the newest one there):
    s3://bucket/prefix, s3://bucket/prefix/checkpoints, or s3://bucket/prefix/checkpoints/step_N."""
    parts = url.rstrip("/").split("/")
    if parts[-1].startswith("step_"):
        if len(parts) < 5 or parts[-2] != CHECKPOINTS:  # scheme:, "", bucket, ..., checkpoints, step_N
            raise ConfigError("resume", f"is {url}, a step_N folder outside a {CHECKPOINTS}/ folder (where the "
                                        f"runner commits checkpoints); give {RESUME_FORMS}")
        return "/".join(parts[:-2]), parts[-1]
    if parts[-1] == CHECKPOINTS and len(parts) >= 4:
        return "/".join(parts[:-1]), None
    return "/".join(parts), None


class Storage:
    """One `checkpoint.dir` URL: its checkpoints/ and export/ folders, through fsspec."""

    def __init__(self, url: str, key: str = "checkpoint.dir"):
        """`key` is the setting the URL came from (checkpoint.dir, or resume for `resume=<URL>`), named in errors."""
        self.url, self.key = url.rstrip("/"), key
        valid = ("a URL (s3://bucket/prefix, gs://bucket/prefix, file:///shared/checkpoints), or null to keep "
                 "checkpoints in <run dir>/checkpoints") if key == "checkpoint.dir" else RESUME_FORMS
        if "://" not in self.url:
            raise ConfigError(key, f"is {url}; give {valid}")
        protocol = self.url.split("://", 1)[0]
        try:
            from fsspec.core import url_to_fs

            # A fresh client each time: fsspec caches file system objects by their arguments, not by the
            # environment, and the credentials or endpoint may have changed since.
            # A local or shared file system (file://) makes the folders a checkpoint's files go into, as a bucket's
            # keys need none; its put_file and pipe would fail on a folder not there yet.
            options = {"auto_mkdir": True} if protocol in ("file", "local") else {}
            self.fs, self.root = url_to_fs(self.url, skip_instance_cache=True, **options)
        except ImportError as err:
            package = PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
            raise ConfigError(key, f"is {url}, which needs {package}: pip install 'runner-ml[s3]' for S3, or pip "
                                   f"install {package} ({err})") from None
        except ValueError as err:
            raise ConfigError(key, f"is {url}, which fsspec cannot open ({err}); give {valid}") from None

    def __str__(self) -> str:
        return self.url

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def check(self) -> None:
        """Before training: write and delete a small object, so that a bad credential, a missing bucket or a
        read-only prefix fails now, with one message, and not at the first checkpoint."""
        probe = self.path(".runner-probe")
        try:
            self.fs.pipe(probe, b"")
            self.fs.rm(probe)
        except Exception as err:  # noqa: BLE001 - every backend raises its own kinds; one message for all
            raise ConfigError("checkpoint.dir", _access_message(self.url, err)) from None

    def check_readable(self) -> None:
        """Before resuming from it: its checkpoints can be listed (a bad credential or a missing bucket fails here,
        with one message naming the setting); reading is all `resume=<URL>` needs of it."""
        try:
            self.committed()
        except Exception as err:  # noqa: BLE001 - every backend raises its own kinds; one message for all
            raise ConfigError(self.key, _access_message(self.url, err, writing=False)) from None

    def committed(self, folder: str = CHECKPOINTS) -> list[tuple[str, dict]]:
        """(name, manifest) of every committed checkpoint, oldest step first (its files are verified on fetch)."""
        self.fs.invalidate_cache()
        found = []
        for manifest_path in self.fs.glob(self.path(folder, "step_*", files.MANIFEST)):
            try:
                manifest = json.loads(self.fs.cat_file(manifest_path))
            except (OSError, ValueError):
                continue
            if isinstance(manifest, dict) and "files" in manifest and "step" in manifest:
                found.append((manifest_path.rstrip("/").split("/")[-2], manifest))
        return sorted(found, key=lambda item: item[1]["step"])

    def upload(self, checkpoint: Path) -> None:
        """Commit a sealed local checkpoint to the storage: its files, their sizes checked, the manifest last."""
        manifest = files.read_manifest(checkpoint)
        if manifest is None:
            raise CheckpointError(f"checkpoint: {checkpoint} has no manifest to upload")
        name = checkpoint.name
        target = self.path(CHECKPOINTS, name)
        if self.fs.exists(self.path(CHECKPOINTS, name, files.MANIFEST)):
            self._remove(name)  # the same step saved again (a run continued from before it): replaced
        by_size = sorted(manifest["files"], key=lambda file_name: manifest["files"][file_name]["size"])
        for file_name in by_size:
            self.fs.put_file(str(checkpoint / file_name), f"{target}/{file_name}")
        self.fs.invalidate_cache()
        for file_name in by_size:
            size = self.fs.info(f"{target}/{file_name}")["size"]
            if size != manifest["files"][file_name]["size"]:
                raise CheckpointError(f"checkpoint: {self.url}/{CHECKPOINTS}/{name}/{file_name} has {size} bytes "
                                      f"after the upload, the manifest says {manifest['files'][file_name]['size']}; "
                                      "the checkpoint was not committed there (the local copy is complete)")
        self.fs.pipe(f"{target}/{files.MANIFEST}", (checkpoint / files.MANIFEST).read_bytes())

    def upload_export(self, export_dir: Path, names: list[str]) -> None:
        """Export files, in the order given (weights before the .json that names their step)."""
        for file_name in names:
            self.fs.put_file(str(export_dir / file_name), self.path(EXPORT, file_name))

    def retain(self, keep: set[str]) -> None:
        """Delete every committed checkpoint not in `keep` (names), each manifest first."""
        for name, _ in self.committed():
            if name not in keep:
                self._remove(name)

    def remove_uncommitted(self) -> list[str]:
        """Objects under checkpoints/ that no manifest commits (an upload killed midway, a half-done deletion):
        removed before this run uploads anything. Returns their checkpoint names."""
        self.fs.invalidate_cache()
        folder = self.path(CHECKPOINTS)
        try:
            found = self.fs.find(folder)
        except FileNotFoundError:
            return []
        names: dict[str, bool] = {}
        for object_path in found:
            relative = object_path[len(folder.rstrip("/")) + 1:].split("/")
            if len(relative) >= 2:
                names[relative[0]] = names.get(relative[0], False) or relative[1] == files.MANIFEST
        leftovers = sorted(name for name, committed in names.items() if not committed)
        for name in leftovers:
            self.fs.rm(self.path(CHECKPOINTS, name), recursive=True)
        return leftovers

    def fetch_newest(self, directory: Path, verify: bool = True) -> Path | None:
        """The newest committed checkpoint that verifies, downloaded into `directory` (kept when an intact copy is
        there already); each damaged newer one is reported and passed over, and so is one whose manifest says its
        weights hold NaN or inf (as resume=auto does on disk). None when the storage holds none."""
        skipped = []
        for name, manifest in reversed(self.committed()):
            reason = files.nonfinite_in(manifest)
            if reason is not None:
                log.warning("resume: passing over checkpoint %s/%s/%s: %s", self.url, CHECKPOINTS, name, reason)
            else:
                reason = self._fetch(name, directory, verify)
                if reason is None:
                    if skipped:
                        log.warning("resume: falling back to %s/%s/%s, the newest intact checkpoint there "
                                    "(skipped: %s)", self.url, CHECKPOINTS, name, "; ".join(skipped))
                    return directory / name
                log.warning("resume: checkpoint %s/%s/%s is damaged: %s", self.url, CHECKPOINTS, name, reason)
            skipped.append(f"{name}: {reason}")
        if skipped:
            raise CheckpointError(f"resume: every checkpoint in {self.url}/{CHECKPOINTS} is damaged: "
                                  f"{'; '.join(skipped)}")
        return None

    def fetch(self, name: str, directory: Path, verify: bool = True) -> Path:
        """Exactly the committed checkpoint `name`, downloaded into `directory` and verified (an intact copy there
        is kept); one that is not committed, is damaged or holds NaN or inf is refused, naming it."""
        committed = dict(self.committed())
        where = f"{self.url}/{CHECKPOINTS}/{name}"
        if name not in committed:
            listed = ", ".join(committed) or "none"
            raise CheckpointError(f"resume: {where} is not a committed checkpoint (no {files.MANIFEST} there); "
                                  f"committed in {self.url}/{CHECKPOINTS}: {listed}")
        reason = files.nonfinite_in(committed[name]) or self._fetch(name, directory, verify)
        if reason is not None:
            raise CheckpointError(f"resume: cannot load {where}: {reason}")
        return directory / name

    def _fetch(self, name: str, directory: Path, verify: bool) -> str | None:
        """Download one committed checkpoint unless an intact copy is there; why it cannot be used, or None."""
        local = directory / name
        if local.is_dir() and files.damage(local, verify) is None:
            return None
        try:
            self._download(name, directory)
            reason = files.damage(local, verify)
        except (OSError, ValueError) as err:  # an object deleted or unreadable since the commit
            reason = f"it could not be downloaded ({type(err).__name__}: {first_line(err)})"
        if reason is not None:
            files.remove_checkpoint(local)
        return reason

    def _download(self, name: str, directory: Path) -> None:
        """Into a partial directory, renamed into place once every file is there (a kill leaves a leftover that
        the next run removes, never a checkpoint)."""
        directory.mkdir(parents=True, exist_ok=True)
        partial = files.partial_path(directory, name)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        source = self.path(CHECKPOINTS, name)
        raw = self.fs.cat_file(f"{source}/{files.MANIFEST}")
        manifest = json.loads(raw)
        for file_name in manifest.get("files", {}):
            if "/" in file_name or file_name.startswith("."):
                if file_name != ".metadata":  # DCP's metadata; anything else that leaves the folder is refused
                    raise CheckpointError(f"resume: {self.url}/{CHECKPOINTS}/{name}/{files.MANIFEST} names "
                                          f"'{file_name}', which is not a checkpoint file; it was not downloaded")
            self.fs.get_file(f"{source}/{file_name}", str(partial / file_name))
        (partial / files.MANIFEST).write_bytes(raw)
        shutil.rmtree(directory / name, ignore_errors=True)
        partial.rename(directory / name)

    def _remove(self, name: str) -> None:
        self.fs.rm(self.path(CHECKPOINTS, name, files.MANIFEST))
        self.fs.rm(self.path(CHECKPOINTS, name), recursive=True)


def _access_message(url: str, err: Exception, writing: bool = True) -> str:
    text = f"{type(err).__name__}: {first_line(err)}".rstrip(": ")
    missing = "Credential" in type(err).__name__  # botocore's NoCredentialsError, PartialCredentialsError, ...
    if isinstance(err, PermissionError) or missing:
        needs = "list, read, write and delete objects under the prefix" if writing else "list and read objects there"
        why = (f"{'found no credentials to use' if missing else 'refused the credentials'}. For S3 set "
               "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
               f"S3-compatible server; the identity needs to {needs}")
    elif isinstance(err, FileNotFoundError):
        why = ("names a bucket that does not exist (or that these credentials cannot see)"
               + (": create it first" if writing else ""))
    else:
        why = f"could not be {'written to' if writing else 'read'} (a wrong endpoint, or no network?)"
    return f"is {url}, which {why} ({text}). Nothing was trained or written there"
