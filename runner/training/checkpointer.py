"""When to save, what goes in, which checkpoints to keep, and what gets exported; and loading one back.

The loop hands over plain state dicts and its position; every process calls `save` (the RNG states of all ranks
are gathered), the writing process (rank 0) writes once, and all wait at a barrier so no rank runs ahead of a
checkpoint that is still being written. In the `dcp` layout (a sharded model) every rank also writes its shards of
the weights and optimizer state, and an export gathers the whole weights on rank 0 (runner/checkpoint/sharded.py).

The loop's side of checkpoints (layer 6, training/): monitor, keep-best and exports are training knowledge, so
runner/checkpoint/ below it keeps only the on-disk discipline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file
from torch import nn

from runner.checkpoint import files, sharded
from runner.checkpoint.contents import load_plain_state, load_weights, on_host, save_weights
from runner.checkpoint.files import Layout
from runner.checkpoint.hf_export import export_pretrained
from runner.checkpoint.remote import Storage
from runner.checkpoint.resume import refuse_inexact_resume
from runner.checkpoint.rng import capture_rng, restore_rng
from runner.config import CheckpointConfig, MonitorMode
from runner.distributed.dist import all_gather_object, all_reduce, barrier, broadcast_object
from runner.errors import (
    CheckpointError, NonFiniteLoss, ResumeRefused, RunnerError, first_line, write_error, yaml_problem,
)
from runner.ground import better, flatten
from runner.accelerate.parallel import is_sharded
from runner.accelerate.prepared import unwrap_optimizer

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
EXPORT_DIR = "export"
FINAL_EXPORT, FINAL_ABOUT = "final.safetensors", "final.json"


def final_export_step(export_dir: Path) -> int | None:
    """The step whose weights export/final.safetensors holds, or None where that export is not complete. final.json
    is written after the weights (each replaced atomically), so one beside them means that export completed."""
    try:
        recorded = json.loads((export_dir / FINAL_ABOUT).read_text(encoding="utf-8"))["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return recorded if isinstance(recorded, int) and (export_dir / FINAL_EXPORT).is_file() else None


def final_export_missing(export_dir: Path, step: int) -> bool:
    """Whether export/ lacks the final weights of the checkpoint at `step`."""
    return final_export_step(export_dir) != step


def config_hash(resolved: dict) -> str:
    """A stable hash of the resolved config, `resume` left out (it changes between the run and its resumption)."""
    relevant = {key: value for key, value in resolved.items() if key != "resume"}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()


class Checkpointer:
    """Saves into `<run dir>/checkpoints` on a cadence, keeps the last/best K, exports final and best weights; with
    checkpoint.dir, commits each checkpoint and export to that storage too (runner/checkpoint/remote.py)."""

    def __init__(self, run_dir: Path, settings: CheckpointConfig, *, writer: bool, monitor: str,
                 monitor_mode: MonitorMode, world_size: int, resolved: dict, layout: Layout = Layout.safetensors):
        self.directory = run_dir / "checkpoints"
        self.export_dir = run_dir / EXPORT_DIR
        self.settings = settings
        self.writer = writer and settings.enabled
        self.monitor, self.mode = monitor, MonitorMode(monitor_mode)
        self.maximize = self.mode is MonitorMode.max
        self.world_size = world_size
        self.resolved = resolved
        self.layout = Layout(layout)
        self.best: dict | None = None  # {"step", "value"} of the best monitored value saved so far
        self.last_path: Path | None = None  # the newest checkpoint written by this process
        # Sealing (hashing, fsync, manifest, rename, export, pruning) runs in one background thread while
        # training goes on; the next save, wait() and the end of the run wait for it.
        self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint") if self.writer else None
        self._pending: Future | None = None
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finite-check")
        if self.writer and self.directory.is_dir():
            for leftover in files.remove_leftovers(self.directory):
                log.warning("removed %s, left by an interrupted checkpoint write", leftover)
        # checkpoint.dir: each sealed checkpoint and export is also committed there (runner/checkpoint/remote.py).
        self.storage = Storage(settings.dir) if self.writer and settings.dir else None
        if self.storage is not None:
            for leftover in self.storage.remove_uncommitted():
                log.warning("removed %s/checkpoints/%s, left by an interrupted upload (it had no manifest)",
                            self.storage, leftover)

    @classmethod
    def disabled(cls) -> "Checkpointer":
        """One that never saves: for a Loop run in-process without checkpoints."""
        return cls(Path("."), CheckpointConfig(enabled=False), writer=False, monitor="", monitor_mode=MonitorMode.max,
                   world_size=1, resolved={})

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def every_epoch(self) -> bool:
        return self.settings.enabled and self.settings.every_epoch

    def due(self, step: int, evaluated: bool) -> bool:
        """Whether the cadence asks for a checkpoint after this optimizer step."""
        every = self.settings.every_n_steps
        return self.settings.enabled and (bool(every and step % every == 0) or (evaluated and self.settings.keep_best > 0))

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state: dict, source: Path) -> None:
        """`source`: the checkpoint the state came from. The best value, which decides when export/best is
        written, comes back only from one of this run dir's own checkpoints. A run continued in a new run dir
        (resume=<another run dir>, or a URL) exports the best of its own evaluations, as its summary and result.json
        (read from its own metrics.jsonl) report it; the other run's best weights stay in that run's export.
        Lightning's ModelCheckpoint does the same when its dirpath changes (it does not reload best_model_score)."""
        if source.resolve().parent == self.directory.resolve():
            self.best = state.get("best")
        elif state.get("best") is not None:
            log.info("export/best: the run that wrote %s had its best %s at step %d (in its own export/); this run "
                     "dir's best starts with this run's evaluations", source, self.monitor, state["best"]["step"])

    def save(self, model: nn.Module, state: dict, position: dict, metrics: dict, final: bool = False,
             optimizer=None) -> Path | None:
        """Write one checkpoint. `position` holds step, epoch, batch_in_epoch; `metrics` those logged at this step;
        `optimizer` (needed in the dcp layout) is saved with the model instead of a state["optimizer"].
        Returns once the files are written (training may go on); the checkpoint appears when sealed."""
        if not self.settings.enabled:
            return None
        # Checked while the files are written (it reads the tensors, the writers read them too): decided before
        # the seal, at a fraction of its cost.
        finite = self._checker.submit(tensors_are_finite, trained_tensors(model, unwrap_optimizer(optimizer)))
        # A collective (every process takes part): what differs between ranks, RNG included, is kept per rank.
        per_rank = all_gather_object({**state.get("per_rank", {}), "rng": capture_rng()})
        # Every rank keeps the best value (the metrics are the same on all): a sharded export needs all of them.
        improved = self._track_best(position["step"], metrics.get(self.monitor))
        if self.writer:
            self._finish_pending()
        state = {**state, "per_rank": per_rank, "checkpointer": self.state_dict()}
        if self.layout is Layout.dcp:
            path = self._write_sharded(model, unwrap_optimizer(optimizer), state, position, metrics, improved, final,
                                       finite)
        else:
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            if self.writer:
                self._write(model, state, position)
            self._refuse_nonfinite(finite, model, position["step"])
            path = self._start_seal(position, metrics, improved, final, weights=None) if self.writer else None
            if self.writer and final and self.settings.export:  # transformers models also get export/hf/
                export_pretrained(model, self.export_dir)
        barrier()
        # Every rank knows where rank 0 wrote (resuming assumes a file system all ranks share).
        self.last_path = self.directory / files.checkpoint_name(position["step"])
        return path

    def export_saved(self, model: nn.Module, position: dict, metrics: dict) -> None:
        """The final exports from the checkpoint already saved at `position` (the run ends on a step that was just
        checkpointed). Every process calls it: a sharded model's weights are gathered."""
        if self.settings.enabled and self.settings.export:
            self._export_final(model, position, metrics)

    def export_missing(self, model: nn.Module, position: dict, metrics: dict) -> bool:
        """For a finished run completed again (`resume=auto`): the final exports of the checkpoint at `position`,
        only if export/ lacks them. Every process calls it; rank 0 decides. Returns whether they were written."""
        if not (self.settings.enabled and self.settings.export):
            return False
        missing = broadcast_object(final_export_missing(self.export_dir, position["step"]) if self.writer else None)
        if missing:
            self._export_final(model, position, metrics)
            log.info("export/%s was missing: written from %s", FINAL_EXPORT, files.checkpoint_name(position["step"]))
        return bool(missing)

    def _export_final(self, model: nn.Module, position: dict, metrics: dict) -> None:
        path = self.directory / files.checkpoint_name(position["step"])
        weights = sharded.full_weights(model, self.world_size > 1) if self.layout is Layout.dcp else None
        if self.writer:
            self._finish_pending()  # that checkpoint sealed first: its model.safetensors is the source
            try:
                self._export(path, {"step": position["step"], self.monitor: metrics.get(self.monitor)}, best=False,
                             final=True, weights=weights)
            except OSError as err:
                raise write_error(err, self.export_dir, f"the export of {path.name} (the checkpoint itself is "
                                                        "complete)") from err
            export_pretrained(model, self.export_dir, state_dict=weights)  # transformers models: export/hf/
        barrier()

    def wait(self) -> None:
        """Until the last checkpoint is sealed (a background failure is raised here), then line all ranks up."""
        if self.writer:
            self._finish_pending()
        barrier()

    def _refuse_nonfinite(self, finite: Future, model: nn.Module, step: int) -> None:
        """Every rank, once the files are written and before the seal: a NaN or inf in the weights or the optimizer
        state (a NaN gradient with a finite loss puts one there) must not become the newest checkpoint, which
        resume=auto would load and fail on again; its partial files are removed. Buffers are not checked: a -inf
        attention mask is legitimate."""
        nonfinite = torch.tensor([0.0 if finite.result() else 1.0], device=_device_of(model))
        if all_reduce(nonfinite, "max").item() == 0:
            return
        if self.writer:
            shutil.rmtree(files.partial_path(self.directory, files.checkpoint_name(step)), ignore_errors=True)
        found = files.complete_checkpoints(self.directory)  # rank 0 sealed the previous one before the reduce
        last = (f"resume=auto continues from {found[-1][0].name}, the last finite checkpoint" if found else
                "no checkpoint was saved before it, so resume=auto starts from scratch")
        raise NonFiniteLoss(
            f"checkpoint: the weights or optimizer state held NaN or inf after optimizer step {step} (a NaN or inf "
            f"gradient can do this while the loss is still finite), so {files.checkpoint_name(step)} was not saved; "
            f"{last}. Resuming repeats the same steps, so first lower optimizer.lr, clip gradients with "
            "trainer.max_grad_norm, or set trainer.on_nonfinite=skip to skip steps with non-finite gradients")

    def settle_after_interrupt(self) -> None:
        """After Ctrl-C in a one-process run: let a seal under way finish (the process would wait for it on exit
        anyway), so that the message that follows names the newest checkpoint. A failed seal is left for resume to
        pass over. Several processes need nothing: each finishes its seal on exit before the launcher reports."""
        if self.writer and self.world_size == 1:
            try:
                self._finish_pending()
            except Exception:  # noqa: BLE001 - the run is ending on Ctrl-C; resume reports a bad checkpoint
                pass

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _track_best(self, step: int, value: float | None) -> bool:
        improved = value is not None and math.isfinite(value) and (
            self.best is None or better(value, self.best["value"], self.mode))
        if improved:
            self.best = {"step": step, "value": value}
        return improved

    def _manifest(self, position: dict, metrics: dict) -> dict:
        value = metrics.get(self.monitor)
        return {
            **position,
            "world_size": self.world_size,
            "layout": self.layout.value,
            "finite": True,  # checked before every save: resume=auto passes over checkpoints marked otherwise
            "config_hash": config_hash(self.resolved),
            "monitor": self.monitor,
            "monitor_value": value if value is not None and math.isfinite(value) else None,
            "metrics": metrics,
        }

    def _write(self, model: nn.Module, state: dict, position: dict) -> None:
        writers = {
            MODEL_FILE: lambda path: save_weights(model, path),
            STATE_FILE: lambda path: torch.save(on_host(state), path),
            CONFIG_FILE: lambda path: path.write_text(yaml.safe_dump(self.resolved, sort_keys=False), encoding="utf-8"),
        }
        files.write_files(self.directory, files.checkpoint_name(position["step"]), writers)

    def _write_sharded(self, model: nn.Module, optimizer, state: dict, position: dict, metrics: dict,
                       improved: bool, final: bool, finite: Future) -> Path | None:
        """Every rank: its shards of the weights and optimizer state; rank 0: the rest, then the seal. An export
        due now gathers the whole weights first (a CPU copy, written by the seal in the background)."""
        if optimizer is None:
            raise CheckpointError("checkpoint: the dcp layout saves the optimizer with the model; pass optimizer=")
        distributed = self.world_size > 1
        weights = sharded.full_weights(model, distributed) if self.settings.export and (improved or final) else None
        name = files.checkpoint_name(position["step"])
        tensors = {"model": sharded.model_state(model), "optimizer": sharded.optimizer_state(model, optimizer)}
        sharded.write(self.directory, name, tensors, self.writer, distributed)
        if self.writer:
            state = {key: value for key, value in state.items() if key != "optimizer"}
            files.write_files(self.directory, name, {
                STATE_FILE: lambda path: torch.save(state, path),
                CONFIG_FILE: lambda path: path.write_text(yaml.safe_dump(self.resolved, sort_keys=False),
                                                          encoding="utf-8"),
            }, fresh=False)
        self._refuse_nonfinite(finite, model, position["step"])
        if not self.writer:
            return None
        if final and self.settings.export:  # transformers models also get export/hf/, from the gathered weights
            export_pretrained(model, self.export_dir, state_dict=weights)
        return self._start_seal(position, metrics, improved, final, weights)

    def _start_seal(self, position: dict, metrics: dict, improved: bool, final: bool, weights) -> Path:
        name = files.checkpoint_name(position["step"])
        about = {"step": position["step"], self.monitor: metrics.get(self.monitor)}
        self._pending = self._sealer.submit(self._seal, name, self._manifest(position, metrics), about, improved,
                                            final, weights)
        return self.directory / name

    def _seal(self, name: str, manifest: dict, about: dict, best: bool, final: bool, weights) -> Path:
        path = files.seal(self.directory, name, manifest)
        if self.storage is not None:
            self._upload(path)  # committed there before its export (which names its step) and before retention
        try:
            if self.settings.export and (best or final):
                self._export(path, about, best, final, weights)
            self._apply_retention()
        except files.WRITE_ERRORS as err:
            raise write_error(err, self.export_dir, f"the export of {path.name} (the checkpoint itself is "
                                                    "complete)") from err
        return path

    def _upload(self, path: Path) -> None:
        with self._storage_errors(f"uploading {path.name} to {self.storage}/checkpoints", f"it was not committed "
                                  f"there, and is complete in {self.directory}: resume=auto on this machine "
                                  "continues from it"):
            self.storage.upload(path)

    @contextmanager
    def _storage_errors(self, doing: str, consequence: str):
        """An error of the storage (network, permissions, quota) as one message naming it; not taken for a
        local write error (the local files are complete)."""
        try:
            yield
        except RunnerError:
            raise
        except Exception as err:  # each storage library has its own (botocore's EndpointConnectionError is no OSError)
            raise CheckpointError(f"checkpoint: {doing} failed ({type(err).__name__}: {first_line(err)}); "
                                  f"{consequence}") from err

    def _export(self, path: Path, about: dict, best: bool, final: bool, weights: dict | None) -> None:
        """Weights as standalone safetensors files plus the resolved config, readable without the runner: the
        checkpoint's model.safetensors, or the sharded model's gathered `weights` (one plain state dict)."""
        self.export_dir.mkdir(exist_ok=True)
        (self.export_dir / CONFIG_FILE).write_text(yaml.safe_dump(self.resolved, sort_keys=False), encoding="utf-8")
        source = path / MODEL_FILE
        if weights is not None:
            source = self.export_dir / f"{files.PARTIAL_PREFIX}weights.safetensors"
            save_file(weights, str(source))
        written = [CONFIG_FILE]
        for wanted, name in ((best, "best"), (final, "final")):
            if wanted:
                files.copy_durably(source, self.export_dir / f"{name}.safetensors")
                (self.export_dir / f"{name}.json").write_text(json.dumps(about), encoding="utf-8")
                written += [f"{name}.safetensors", f"{name}.json"]
        if weights is not None:
            source.unlink()
        if self.storage is not None:
            with self._storage_errors(f"uploading export/ to {self.storage}", f"export/ is complete in "
                                      f"{self.export_dir}"):
                self.storage.upload_export(self.export_dir, written)  # each .json after the weights it names

    def _apply_retention(self) -> None:
        if self.settings.keep_last is None:
            return
        found = files.complete_checkpoints(self.directory)
        keep = self._kept([(path.name, manifest) for path, manifest in found])
        for path, _ in found:
            if path.name not in keep:
                files.remove_checkpoint(path)
        if self.storage is not None:  # the same rule there, once the newest is committed (_seal uploads first)
            with self._storage_errors(f"deleting old checkpoints in {self.storage}", "the newest is committed"):
                self.storage.retain(self._kept(self.storage.committed()))

    def _kept(self, found: list[tuple[str, dict]]) -> set[str]:
        """The names retention keeps of these (name, manifest), oldest first: the keep_last newest, the keep_best
        best by the monitored value."""
        keep = {name for name, _ in found[-self.settings.keep_last:]}
        scored = [(manifest["monitor_value"], name) for name, manifest in found
                  if manifest.get("monitor_value") is not None and manifest.get("monitor") == self.monitor]
        scored.sort(key=lambda item: item[0], reverse=self.maximize)
        return keep | {name for _, name in scored[:self.settings.keep_best]}


def trained_tensors(model: nn.Module, optimizer) -> list[torch.Tensor]:
    """The parameters and the optimizer state's floating tensors, each as this process holds it (a sharded
    tensor's local shard: every rank checks its own, one all-reduce combines the verdicts)."""
    from torch.distributed.tensor import DTensor

    tensors = list(model.parameters())
    if optimizer is not None:
        tensors += [value for state in optimizer.state.values() for value in state.values()
                    if isinstance(value, torch.Tensor)]
    local = [tensor.to_local() if isinstance(tensor, DTensor) else tensor for tensor in tensors]
    return [tensor.detach() for tensor in local if tensor.is_floating_point() and tensor.numel()]


def tensors_are_finite(tensors: list[torch.Tensor]) -> bool:
    """One fused pass per device and dtype: each tensor's 2-norm (a NaN or inf anywhere makes it non-finite),
    accumulated in float32 at least. A norm can also overflow from large finite values; only the tensors whose
    norm is not finite (none, in a healthy run) are then checked element by element."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for (_, dtype), group in groups.items():
        wider = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
        norms = torch._foreach_norm(group, 2, dtype=wider)
        if bool(torch.stack(norms).isfinite().all()):
            continue
        if any(not bool(norm.isfinite()) and not bool(torch.isfinite(tensor).all())
               for tensor, norm in zip(group, norms)):
            return False
    return True


def _device_of(model: nn.Module) -> torch.device:
    """Where the all-reduce's one number lives: the model's device (NCCL reduces only device tensors)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def restore(path: Path, model: nn.Module, optimizer=None, scheduler=None, scaler=None, *, rank: int = 0,
            world_size: int = 1, global_batch: int | None = None, resolved: dict | None = None) -> dict:
    """Load a (verified) checkpoint into these objects; returns the saved state dict: "loop" and "checkpointer"
    for their owners, "this_rank" for what was saved per process (RNG: see apply_rng). On another number of
    processes it refuses what cannot continue exactly (another global batch, layers that behave per process), and
    weights that do not fit. Every rank calls it (a dcp checkpoint is loaded collectively)."""
    manifest = files.read_manifest(path)
    if manifest is None:
        raise CheckpointError(f"resume: {path} is not a complete checkpoint (no valid {files.MANIFEST})")
    if manifest["world_size"] != world_size:
        refuse_inexact_resume(path, world_size, manifest.get("global_batch") if global_batch is None else global_batch)
        refuse_per_process_layers(model, path, manifest["world_size"], world_size)
    changed: list[str] = []
    if resolved is not None and manifest["config_hash"] != config_hash(resolved):
        same_batch = global_batch is not None and manifest.get("global_batch") == global_batch
        changed = _warn_config_changes(path, resolved, same_batch)
    # A changed optimizer or schedule: keep the hyperparameters this run's config gave the optimizer, before the
    # checkpoint's state replaces them (put back by apply_changed_hyperparameters below).
    retune = optimizer is not None and any(key.startswith(("optimizer.", "scheduler.")) for key in changed)
    configured = [{key: value for key, value in group.items() if key != "params"}
                  for group in unwrap_optimizer(optimizer).param_groups] if retune else []
    layout = files.layout_of(manifest)
    if layout is Layout.dcp:
        entries = {"model": (model, None)}
        if optimizer is not None:
            entries["optimizer"] = (model, unwrap_optimizer(optimizer))
        sharded.load(path, entries, world_size > 1)
    elif is_sharded(model):
        raise CheckpointError(f"resume: {path} holds whole weights (written without parallel=fsdp) and this run "
                              "shards the model; resume it with the parallel setting it was written with, or start "
                              f"a new run from its weights (checkpoint.init_from={path})")
    else:
        load_weights(path / MODEL_FILE, model, "resume")
    # mmap: tensors are read from the (usually cached) file as load_state_dict copies them, not read twice.
    state = load_plain_state(path / STATE_FILE, "resume", "Resume from another checkpoint (resume=<run dir>/"
                             "checkpoints/step_N) or start a new run", mmap=True, refusal=ResumeRefused)
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler")):
        if obj is not None and state.get(key) is not None:
            try:
                obj.load_state_dict(state[key])
            except (ValueError, KeyError, RuntimeError) as err:
                raise CheckpointError(f"resume: the {key} state in {path} does not fit this run's {key}: {err}") from err
    if retune:
        apply_changed_hyperparameters(unwrap_optimizer(optimizer), getattr(scheduler, "scheduler", scheduler),
                                      configured)
    state["manifest"] = manifest
    state["this_rank"] = this_rank(state["per_rank"], rank, world_size)
    return state


def this_rank(per_rank: list[dict], rank: int, world_size: int) -> dict:
    """What this rank saved. On another process count each rank takes the random generators of rank `rank mod
    writers` (refuse_per_process_layers made sure the model's layers draw nothing per process) and the writers'
    mean of every per-rank float tensor (the loss window's sums: the mean over all ranks is what gets logged, and
    Loop.load_state_dict scales it to the new micro-batches)."""
    if len(per_rank) == world_size:
        return per_rank[rank]
    mine = dict(per_rank[rank % len(per_rank)])
    for key, value in mine.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            mine[key] = sum(saved[key] for saved in per_rank) / len(per_rank)
    return mine


def per_process_layers(model: nn.Module) -> dict[str, str]:
    """The layers whose training depends on the process they run in, by name: a random draw from each process's
    own generator (dropout, attention dropout) or statistics of each device's own batch (batch norm)."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            found[name] = "batch norm"
        elif isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            found[name] = f"dropout p={module.p:g}"
        elif isinstance(getattr(module, "dropout", None), float) and module.dropout > 0:
            found[name] = f"attention dropout {module.dropout:g}"  # nn.MultiheadAttention's, or sdpa's dropout_p
    return found


def refuse_per_process_layers(model: nn.Module, path: Path, written: int, world_size: int) -> None:
    """A run continued on another number of processes is exact only for layers that compute the same on any
    split of the global batch. Dropout draws from each process's generator and batch norm normalises each
    device's own batch: an uninterrupted run's draws and statistics cannot be reproduced on another count."""
    layers = per_process_layers(model)
    if not layers:
        return
    named = ", ".join(f"{name or 'the model'} ({kind})" for name, kind in list(layers.items())[:4])
    more = f" and {len(layers) - 4} more" if len(layers) > 4 else ""
    raise ResumeRefused(
        f"resume: {path} was written by {written} process(es) and this run has {world_size}, and the model has "
        f"layers that compute per process: {named}{more}. Dropout draws from each process's own random generator "
        "and batch norm normalises each device's own batch, so the steps after the resume cannot be the ones an "
        f"uninterrupted run takes. Resume with hardware.num_processes={written}, or start a new run from its "
        f"weights (checkpoint.init_from={path})")


def read_config(file: Path) -> dict:
    """A checkpoint's (or export's) config.yaml as plain data. yaml.safe_load builds no objects, so a python tag
    (`!!python/object/apply:...`) runs nothing; it is refused with this message instead of a ConstructorError."""
    try:
        saved = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark, problem = yaml_problem(err)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise CheckpointError(
            f"{file} is not plain YAML data{where} ({problem}): the runner reads a checkpoint's config.yaml "
            "as data only and builds no objects from it, so nothing in it was run. It was altered after it was "
            "written or not written by the runner: use another checkpoint, or restore the file from the run's own "
            "config.yaml") from None
    return saved if isinstance(saved, dict) else {}


# Where and how the run executes, not what it computes: with the same global batch (refuse_inexact_resume), a
# run continued with other values of these is the same experiment.
EXECUTION_KEYS = ("hardware.", "gpu_ids", "trainer.micro_batch_size", "trainer.grad_accum_steps",
                  "trainer.per_device_batch_size", "checkpoint.dir")


def _warn_config_changes(path: Path, resolved: dict, same_batch: bool) -> list[str]:
    """Warn that the config differs from the checkpoint's, naming the keys; returns them."""
    try:
        saved = read_config(path / CONFIG_FILE)
    except OSError:
        saved = {}
    before, now = flatten(saved or {}), flatten(resolved)
    changed = sorted(key for key in before.keys() | now.keys() if key != "resume" and before.get(key) != now.get(key))
    if same_batch:
        changed = [key for key in changed if not key.startswith(EXECUTION_KEYS)]
        if not changed:
            return []
    log.warning("resume: the config differs from the one that wrote %s (%s); the run continues with the new "
                "values and is no longer an exact continuation", path, ", ".join(changed) or "formatting only")
    return changed


def apply_changed_hyperparameters(optimizer, scheduler, configured: list[dict]) -> None:
    """After a resume whose config changed the optimizer or schedule, put this config's hyperparameters back into
    the optimizer the checkpoint's state overwrote (a lowered learning rate, the usual remedy for a NaN, would
    otherwise be the old one). The learning rate keeps its place in the schedule: the new base learning rate times
    the schedule's factor at the step reached (a LambdaLR's own factor, which a changed schedule changes too;
    another schedule's current rate scaled by new base / old base). `configured`: the param groups' values, less
    their params, as this run built them."""
    from torch.optim.lr_scheduler import LambdaLR

    for index, (group, fresh) in enumerate(zip(optimizer.param_groups, configured)):
        for key, value in fresh.items():
            if key not in ("lr", "initial_lr"):
                group[key] = value
        if "initial_lr" not in group or "initial_lr" not in fresh:  # no schedule: the configured rate as is
            group["lr"] = fresh["lr"]
            continue
        old_base, new_base = group["initial_lr"], fresh["initial_lr"]
        group["initial_lr"] = new_base
        if scheduler is not None and index < len(getattr(scheduler, "base_lrs", [])):
            scheduler.base_lrs[index] = new_base
        if isinstance(scheduler, LambdaLR):
            group["lr"] = new_base * scheduler.lr_lambdas[index](scheduler.last_epoch)
        elif old_base:
            group["lr"] = group["lr"] * new_base / old_base
    if scheduler is not None and hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    log.info("resume: the optimizer continues with this config's hyperparameters (learning rate %s)",
             ", ".join(f"{group['lr']:.6g}" for group in optimizer.param_groups))


def apply_rng(state: dict) -> None:
    """Restore this rank's RNG last, right before training continues, so nothing built after draws from it."""
    restore_rng(state["this_rank"]["rng"])
