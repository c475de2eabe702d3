"""The checkpoint format and its guarantees, in-process: atomic writes, verification, fallback, retention,
export, safety, refusals, RNG and the stop-signal object."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from runner.checkpoint import MANIFEST, complete_checkpoints, damage, find_resume, read_pointer
from runner.training.checkpointer import MODEL_FILE, STATE_FILE, Checkpointer, restore
from runner.training import checkpointer as checkpointer_module
from runner.checkpoint import files
from runner.checkpoint.rng import capture_rng, restore_rng
from runner.config import CheckpointConfig, MonitorMode
from runner.errors import CheckpointError, ConfigError, DiskFull, ResumeRefused, WriteError
from runner.models import MLP

from checkpoint_helpers import RESOLVED, NotPlainData, checkpointer_in, save_step, trained_objects

def test_checkpoint_manifest_matches_its_files(tmp_path):
    model, optimizer = trained_objects()
    path = save_step(checkpointer_in(tmp_path), model, optimizer, step=7, accuracy=0.5)
    assert path == tmp_path / "checkpoints" / "step_00000007" and read_pointer(tmp_path / "checkpoints") == path.name
    manifest = files.read_manifest(path)
    assert {k: manifest[k] for k in ("format", "step", "epoch", "batch_in_epoch", "world_size", "monitor_value")} == {
        "format": 1, "step": 7, "epoch": 0, "batch_in_epoch": 7, "world_size": 1, "monitor_value": 0.5}
    assert set(manifest["files"]) == {MODEL_FILE, STATE_FILE, "config.yaml"}
    for name, entry in manifest["files"].items():
        assert entry["size"] == (path / name).stat().st_size
        assert entry["sha256"] == [hashlib.sha256((path / name).read_bytes()).hexdigest()]  # one block: small files
    assert yaml.safe_load((path / "config.yaml").read_text()) == RESOLVED
    assert damage(path) is None and not list((tmp_path / "checkpoints").glob(".*"))


def test_the_state_file_needs_no_unsafe_globals(tmp_path):
    model, optimizer = trained_objects()
    scaler = torch.amp.GradScaler("cpu")
    checkpointer = checkpointer_in(tmp_path)
    path = checkpointer.save(model, {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
                             {"step": 1, "epoch": 0, "batch_in_epoch": 1}, {})
    checkpointer.wait()
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path / STATE_FILE)) == []
    state = torch.load(path / STATE_FILE, weights_only=True)
    assert state["scaler"]["scale"] == 65536.0 and set(state["per_rank"][0]["rng"]) == {"python", "numpy", "torch", "cuda"}


def test_restore_brings_back_weights_optimizer_and_rng(tmp_path):
    model, optimizer = trained_objects(seed=0)
    path = save_step(checkpointer_in(tmp_path), model, optimizer, step=3)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    fresh_model, fresh_optimizer = trained_objects(seed=1)
    state = restore(path, fresh_model, fresh_optimizer, resolved=RESOLVED)
    checkpointer_module.apply_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert state["loop"] == {"step": 3}


def test_numpy_and_python_rng_round_trip(tmp_path):
    """NumPy and Python RNG states round-trip through a weights_only load."""
    np.random.seed(3)
    np.random.randn()  # leaves a cached gaussian: has_gauss=1
    torch.save(capture_rng(), tmp_path / "rng.pt")
    expected = (np.random.randn(), np.random.rand(), random.random())
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (np.random.randn(), np.random.rand(), random.random()) == expected


def test_disk_full_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """A full disk while saving keeps the previous checkpoint and removes the partial files."""
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    previous = save_step(checkpointer, model, optimizer, step=1)

    def full_disk(obj, path):
        with open(path, "wb") as handle:
            handle.write(b"\0" * 1000)  # some bytes made it to disk before the device filled up
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpointer_module.torch, "save", full_disk)
    with pytest.raises(DiskFull) as caught:
        save_step(checkpointer, model, optimizer, step=2)
    assert str(caught.value) == (
        f"no space left on the disk holding {tmp_path / 'checkpoints' / 'step_00000002'} while writing checkpoint "
        "step 2 (its partial files were removed; earlier checkpoints are untouched)")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    assert read_pointer(tmp_path / "checkpoints") == "step_00000001" and damage(previous) is None


@pytest.mark.parametrize("message, expected", [
    ("Error while serializing: I/O error: No space left on device (os error 28)",
     "no space left on the disk holding {final} while writing checkpoint step 2"),
    ("Error while serializing: I/O error: Input/output error (os error 5)",
     "could not write {final} while writing checkpoint step 2: Error while serializing: I/O error: Input/output "
     "error (os error 5)"),
])
def test_safetensors_error_is_a_clean_write_error(tmp_path, monkeypatch, message, expected):
    """safetensors raises its own SafetensorError (neither OSError nor RuntimeError) when the disk fills up: it
    becomes the WriteError, and no partial folder is left."""
    from safetensors import SafetensorError

    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    save_step(checkpointer, model, optimizer, step=1)

    def full_disk(model, path, *args, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"\0" * 1000)
        raise SafetensorError(message)

    monkeypatch.setattr("runner.checkpoint.contents.save_model", full_disk)  # what save_weights calls on a CPU
    with pytest.raises(WriteError) as caught:
        save_step(checkpointer, model, optimizer, step=2)
    final = tmp_path / "checkpoints" / "step_00000002"
    assert str(caught.value) == expected.format(final=final) + (
        " (its partial files were removed; earlier checkpoints are untouched)")
    assert isinstance(caught.value, DiskFull) == ("No space" in message)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]


@pytest.mark.parametrize("crash_in", ["write_pointer", "fsync_path", "_replace_dir"])
def test_any_crash_leaves_a_loadable_checkpoint(tmp_path, monkeypatch, crash_in):
    """A crash at any stage of the save leaves a loadable checkpoint."""
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    save_step(checkpointer, model, optimizer, step=1)

    def crash(*args, **kwargs):
        raise OSError(errno.EIO, "simulated crash")

    monkeypatch.setattr(files, crash_in, crash)
    with pytest.raises(WriteError, match="simulated crash"):
        save_step(checkpointer, model, optimizer, step=2)
    monkeypatch.undo()
    chosen = find_resume("auto", tmp_path)
    assert chosen is not None and damage(chosen) is None
    assert read_pointer(tmp_path / "checkpoints") == "step_00000001"


def test_resume_auto_falls_back_past_damage(tmp_path, caplog):
    """resume=auto falls back past a damaged newest checkpoint."""
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    for step in (1, 2, 3):
        save_step(checkpointer, model, optimizer, step=step)
    with open(tmp_path / "checkpoints" / "step_00000003" / STATE_FILE, "r+b") as handle:
        handle.seek(100)
        handle.write(b"tampered")  # same size, different bytes: only the sha256 notices
    (tmp_path / "checkpoints" / "step_00000002" / MODEL_FILE).write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING):
        chosen = find_resume("auto", tmp_path)
    assert chosen == tmp_path / "checkpoints" / "step_00000001"
    assert "step_00000003 is damaged" in caplog.text and "does not match its sha256" in caplog.text
    assert "has 9 bytes, the manifest says" in caplog.text
    assert "falling back to step_00000001" in caplog.text

    with pytest.raises(CheckpointError, match=r"cannot load .*step_00000003: .*does not match its sha256"):
        find_resume(str(tmp_path / "checkpoints" / "step_00000003"), tmp_path / "elsewhere")
    assert find_resume(str(tmp_path), tmp_path / "elsewhere") == chosen  # a named run dir: same rule

    # All of them damaged: refused (resume=auto again would meet the same), saying what can be done instead.
    (tmp_path / "checkpoints" / "step_00000001" / MODEL_FILE).write_bytes(b"truncated")
    with pytest.raises(ResumeRefused, match=r"every checkpoint in .* is damaged: .*no checkpoint here can be "
                                            r"resumed: restore its files from a copy, or start a new run"):
        find_resume("auto", tmp_path)


def test_resume_arguments_and_the_fresh_run_guard(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        assert find_resume("auto", tmp_path) is None
    assert "starting from scratch" in caplog.text
    with pytest.raises(CheckpointError, match="neither a checkpoint nor a directory of checkpoints"):
        find_resume(str(tmp_path / "nope"), tmp_path)
    model, optimizer = trained_objects()
    save_step(checkpointer_in(tmp_path), model, optimizer, step=1)
    with pytest.raises(ConfigError, match="already holds a run with checkpoints; continue it with resume=auto"):
        find_resume(None, tmp_path)


def test_inexact_world_size_change_or_model_mismatch_is_named(tmp_path):
    """Another process count continues only with the same global batch and no per-process layers; a checkpoint
    without its global position, another global batch, dropout or batch norm, or another model is refused, named."""
    model, optimizer = trained_objects()
    older = save_step(checkpointer_in(tmp_path / "older"), model, optimizer, step=1)
    with pytest.raises(ResumeRefused, match=r"written by a run with 1 process\(es\), before checkpoints recorded "
                                            r"their global position, and this run has 2.*hardware.num_processes=1"):
        restore(older, model, optimizer, world_size=2, global_batch=8)
    path = save_step(checkpointer_in(tmp_path), model, optimizer, step=1, global_batch=8)
    with pytest.raises(ResumeRefused, match=r"global batch of 8 samples per optimizer step on 1 process\(es\); this "
                                            r"run has 2 and a global batch of 16.*trainer.batch_size=8"):
        restore(path, model, optimizer, world_size=2, global_batch=16)
    for layers, named in ((MLP(4, 3, hidden=[8], dropout=0.1), r"2 \(dropout p=0.1\)"),
                          (torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8)), r"1 \(batch norm\)"),
                          (torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2), r"self_attn \(attention dropout "
                                                                                     r"0.2\), dropout \(dropout")):
        with pytest.raises(ResumeRefused, match=rf"this run has 2, and the model has layers that compute per process: "
                                                rf"{named}.*hardware.num_processes=1, or start a new run from its "
                                                rf"weights \(checkpoint.init_from={path}\)"):
            restore(path, layers, world_size=2, global_batch=8)
    state = restore(path, model, optimizer, rank=1, world_size=2, global_batch=8)
    assert state["this_rank"]["rng"] is not None  # rank 1 of 2 continues rank 0's generators (1 mod 1)
    with pytest.raises(CheckpointError, match=r"weights in .* do not fit this model: .*size mismatch"):
        restore(path, MLP(4, 3, hidden=[16]))
    with pytest.raises(CheckpointError, match=r"do not fit this model: missing \['4.bias', '4.weight'\]"):
        restore(path, torch.nn.Sequential(*MLP(4, 3, hidden=[8]), torch.nn.ReLU(), torch.nn.Linear(3, 3)))


def test_keep_last_and_keep_best(tmp_path):
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path, keep_last=2, keep_best=1)
    for step, accuracy in [(1, 0.2), (2, 0.9), (3, 0.5), (4, None), (5, 0.4)]:
        save_step(checkpointer, model, optimizer, step=step, accuracy=accuracy)
    kept = [manifest["step"] for _, manifest in complete_checkpoints(tmp_path / "checkpoints")]
    assert kept == [2, 4, 5]  # the best (0.9 at step 2) and the last two
    assert checkpointer.best == {"step": 2, "value": 0.9}

    low = checkpointer_in(tmp_path / "min", MonitorMode.min, keep_last=1, keep_best=2)
    for step, accuracy in [(1, 0.3), (2, 0.1), (3, 0.2), (4, 0.5)]:
        save_step(low, model, optimizer, step=step, accuracy=accuracy)
    assert [m["step"] for _, m in complete_checkpoints(tmp_path / "min" / "checkpoints")] == [2, 3, 4]

    by_default = checkpointer_in(tmp_path / "default")  # a 20-epoch run keeps the newest three, not 20
    for step in range(1, 21):
        save_step(by_default, model, optimizer, step=step)
    assert [m["step"] for _, m in complete_checkpoints(tmp_path / "default" / "checkpoints")] == [18, 19, 20]


def test_cadence():
    every = Checkpointer.__new__(Checkpointer)
    every.settings = CheckpointConfig(every_n_steps=3, keep_best=0)
    assert [step for step in range(1, 10) if every.due(step, evaluated=False)] == [3, 6, 9]
    assert not every.due(4, evaluated=True)
    every.settings = CheckpointConfig(every_n_steps=None, keep_best=2)
    assert every.due(4, evaluated=True) and not every.due(4, evaluated=False)
    every.settings = CheckpointConfig(enabled=False, every_n_steps=1)
    assert not every.due(3, evaluated=True) and not every.every_epoch


def test_export_is_loadable_without_the_runner(tmp_path):
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    save_step(checkpointer, model, optimizer, step=1, accuracy=0.7)
    save_step(checkpointer, model, optimizer, step=2, accuracy=0.4, final=True)
    export = tmp_path / "export"
    assert sorted(p.name for p in export.iterdir()) == [
        "best.json", "best.safetensors", "config.yaml", "final.json", "final.safetensors"]
    assert (export / "best.json").read_text() == '{"step": 1, "val/accuracy": 0.7}'
    # The README snippet, in a fresh interpreter that never imports runner.
    snippet = f"""
import sys, yaml, torch
from safetensors.torch import load_file
config = yaml.safe_load(open({str(export / "config.yaml")!r}))
weights = load_file({str(export / "final.safetensors")!r})
assert "runner" not in sys.modules
print(config["model"]["_target_"], sorted(weights), tuple(weights["0.weight"].shape))
"""
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, check=True, env={
        **os.environ, "PYTHONPATH": ""}).stdout
    assert out.strip() == ("runner.models.MLP ['0.bias', '0.weight', '2.bias', '2.weight'] (8, 4)")
    rebuilt = MLP(**{k: v for k, v in yaml.safe_load((export / "config.yaml").read_text())["model"].items()
                     if k != "_target_"})
    rebuilt.load_state_dict(load_file(export / "final.safetensors"))
    x = torch.randn(2, 4)
    assert torch.equal(rebuilt(x), model(x))


def test_block_hashes_find_any_altered_block(tmp_path, monkeypatch):
    """Large files are hashed in blocks, and any altered block is found."""
    monkeypatch.setattr(files, "BLOCK", 1024)
    model, optimizer = trained_objects()
    path = save_step(checkpointer_in(tmp_path), model, optimizer, step=1)
    entry = files.read_manifest(path)["files"][STATE_FILE]
    assert len(entry["sha256"]) == -(-entry["size"] // 1024) > 2
    data = bytearray((path / STATE_FILE).read_bytes())
    data[1024 * 2 + 7] ^= 0xFF  # one bit pattern in the third block
    (path / STATE_FILE).write_bytes(bytes(data))
    assert "does not match its sha256" in damage(path)
    assert damage(path, check_hashes=False) is None  # sizes alone cannot see it


def test_grad_scaler_state_comes_back(tmp_path):
    model, optimizer = trained_objects()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(1))  # the scale tensor exists from the first use on
    scaler.update(new_scale=256.0)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), writer=True, monitor="val/loss",
                                monitor_mode=MonitorMode.min, world_size=1, resolved=RESOLVED)
    path = checkpointer.save(model, {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
                             {"step": 1, "epoch": 0, "batch_in_epoch": 1}, {})
    checkpointer.wait()
    fresh = torch.amp.GradScaler("cpu")
    restore(path, model, optimizer, scaler=fresh)
    assert fresh.get_scale() == 256.0


def test_cuda_rng_is_saved_when_cuda_is_in_use(monkeypatch):
    """No GPU here: stand-ins for torch.cuda check that every device's generator is captured and restored."""
    saved_states = [torch.tensor([1], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: saved_states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.extend)
    state = capture_rng()
    assert state["cuda"] == saved_states
    restore_rng(state)
    assert restored == saved_states


def test_bad_checkpoint_settings_are_reported_together():
    from runner.run.checks import checkpoint_problems
    from runner.config import RunConfig

    config = RunConfig()
    config.checkpoint = CheckpointConfig(every_n_steps=0, keep_last=0, keep_best=-1)
    assert [str(problem) for problem in checkpoint_problems(config)] == [
        "checkpoint.every_n_steps: is 0; it must be 1 or more, or null to turn it off",
        "checkpoint.keep_last: is 0; it must be 1 or more, or null to turn it off",
        "checkpoint.keep_best: is -1; it must be 0 (off) or more",
    ]


def test_checkpoint_appears_only_once_sealed(tmp_path, monkeypatch):
    """Sealing runs in the background, and the checkpoint appears only when sealed."""
    import threading

    release = threading.Event()
    real_seal = files.seal

    def slow_seal(*args):
        release.wait(timeout=300)  # set by the test below; the deadline is for a stuck test, not a slow one
        return real_seal(*args)

    monkeypatch.setattr(files, "seal", slow_seal)
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    path = checkpointer.save(model, {"optimizer": optimizer.state_dict()}, {"step": 4, "epoch": 0, "batch_in_epoch": 4}, {})
    assert path.name == "step_00000004" and not path.exists()  # returned while the files are not sealed yet
    assert complete_checkpoints(tmp_path / "checkpoints") == [] and find_resume("auto", tmp_path) is None
    release.set()
    checkpointer.wait()
    assert damage(path) is None and read_pointer(tmp_path / "checkpoints") == path.name


def test_resealed_pickled_objects_are_refused(tmp_path):
    """Someone rewrote state.pt and recomputed the manifest's hashes: verification passes, loading must not run
    (or even build) the pickled object, and says so without a traceback."""
    model, optimizer = trained_objects()
    checkpointer = checkpointer_in(tmp_path)
    path = save_step(checkpointer, model, optimizer, step=1)
    torch.save({"loop": NotPlainData()}, path / STATE_FILE)
    manifest = files.read_manifest(path)
    digests = files.block_digests([path / name for name in manifest["files"]])
    manifest["files"] = {name: {"size": (path / name).stat().st_size, "sha256": digests[path / name]}
                         for name in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert damage(path) is None  # resealed: the hashes match
    with pytest.raises(CheckpointError, match=r"state.pt cannot be loaded safely \(UnpicklingError: .*altered after "
                                              r"it was written"):
        restore(path, trained_objects()[0], world_size=1)


def test_sharded_layout_keeps_every_guarantee(tmp_path):
    """The sharded layout keeps the same retention, verification, exports and exact restore."""
    # parallel=fsdp's layout from one process (DCP without a process group): what changes is only who writes what.
    model, optimizer = trained_objects()
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(keep_last=2, keep_best=1), writer=True,
                                monitor="val/accuracy", monitor_mode=MonitorMode.max, world_size=1,
                                resolved=RESOLVED, layout=files.Layout.dcp)
    for step, accuracy in [(1, 0.2), (2, 0.9), (3, 0.5), (4, 0.4)]:
        checkpointer.save(model, {"loop": {"step": step}}, {"step": step, "epoch": 0, "batch_in_epoch": step},
                          {"val/accuracy": accuracy}, final=step == 4, optimizer=optimizer)
        checkpointer.wait()
    found = complete_checkpoints(tmp_path / "checkpoints")
    assert [manifest["step"] for _, manifest in found] == [2, 3, 4]  # the best (0.9 at step 2) and the last two
    path, manifest = found[-1]
    assert read_pointer(tmp_path / "checkpoints") == path.name
    assert manifest["layout"] == "dcp" and MODEL_FILE not in manifest["files"]
    assert {".metadata", "__0_0.distcp", STATE_FILE, "config.yaml"} <= set(manifest["files"])
    assert "optimizer" not in torch.load(path / STATE_FILE, weights_only=True)  # it is in the shards
    export = tmp_path / "export"
    assert json.loads((export / "best.json").read_text())["step"] == 2
    for name in ("final", "best"):  # plain safetensors files with the model's own names
        assert set(load_file(export / f"{name}.safetensors")) == set(model.state_dict())

    fresh, fresh_optimizer = trained_objects(seed=1)
    restore(path, fresh, fresh_optimizer)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[key]["exp_avg"], loaded[key]["exp_avg"]) for key in saved)

    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "__0_0.distcp" in damage(path)


def _scheduled(lr: float, weight_decay: float):
    from runner.schedules import warmup_cosine

    torch.manual_seed(0)
    model = MLP(4, 3, hidden=[8])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return model, optimizer, warmup_cosine(optimizer, total_steps=10, warmup_steps=2)


def test_a_resume_with_a_changed_optimizer_config_uses_it(tmp_path):
    """A resume whose config lowers the learning rate (the remedy for a NaN) or changes another optimizer setting
    trains with the new values, at the same place in the schedule; with the config unchanged the checkpoint's
    values come back bit for bit. The optimizer's moments are the checkpoint's either way."""
    written = {**RESOLVED, "optimizer": {"lr": 0.5, "weight_decay": 0.01}}
    model, optimizer, scheduler = _scheduled(0.5, 0.01)
    for _ in range(4):
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    checkpointer = checkpointer_in(tmp_path)
    checkpointer.resolved = written
    path = checkpointer.save(model, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                     "loop": {"step": 4}}, {"step": 4, "epoch": 0, "batch_in_epoch": 4}, {})
    checkpointer.wait()
    same = _scheduled(0.5, 0.01)
    restore(path, *same, resolved=written)
    assert same[1].param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]

    model2, optimizer2, scheduler2 = _scheduled(0.001, 0.1)
    restore(path, model2, optimizer2, scheduler2, resolved={**written, "optimizer": {"lr": 0.001, "weight_decay": 0.1}})
    group = optimizer2.param_groups[0]
    assert group["lr"] == pytest.approx(optimizer.param_groups[0]["lr"] * 0.001 / 0.5)
    assert (group["initial_lr"], group["weight_decay"], scheduler2.base_lrs) == (0.001, 0.1, [0.001])
    assert scheduler2.get_last_lr() == [group["lr"]]
    assert torch.equal(optimizer2.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    scheduler.step(), scheduler2.step()  # the schedule goes on from the new base
    assert group["lr"] == pytest.approx(optimizer.param_groups[0]["lr"] * 0.001 / 0.5)


def test_a_run_resumed_with_a_lower_learning_rate_trains_with_it(tmp_path, capsys):
    """Through the CLI, as troubleshooting.md advises after a NaN: the resumed steps log and use the new rate."""
    from conftest import TINY, read_jsonl, run_in_process

    run = (*TINY, "scheduler=none", "optimizer=sgd", "trainer.max_steps=6", "checkpoint.every_n_steps=3",
           "trainer.log_every_steps=1")
    first = run_in_process(*run, "optimizer.lr=0.5", "hydra.run.dir=first", cwd=tmp_path, capsys=capsys)
    assert first.returncode == 0, first.output
    resumed = run_in_process(*run, "optimizer.lr=0.001", "resume=first/checkpoints/step_00000003",
                             "hydra.run.dir=resumed", cwd=tmp_path, capsys=capsys)
    assert resumed.returncode == 0, resumed.output
    assert "the optimizer continues with this config's hyperparameters (learning rate 0.001)" in resumed.output
    rates = {row["step"]: row["train/lr"] for row in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
             if "train/lr" in row}
    assert rates == {4: 0.001, 5: 0.001, 6: 0.001}


def test_checkpoint_dir_on_a_shared_file_system(tmp_path, capsys):
    """checkpoint.dir=file:///... (a shared file system, docs/checkpoints.md): its folders are made as needed, each
    checkpoint is committed with its manifest, the exports are copied, and a machine without the run dir resumes
    from the URL."""
    from conftest import TINY, run_in_process
    from runner.checkpoint.remote import Storage

    store = f"file://{tmp_path / 'shared' / 'project'}"  # neither folder exists yet
    run = (*TINY, "trainer.max_steps=4", "checkpoint.every_n_steps=2", f"checkpoint.dir={store}")
    first = run_in_process(*run, "hydra.run.dir=first", cwd=tmp_path, capsys=capsys)
    assert first.returncode == 0, first.output
    stored = Storage(store)
    assert [name for name, _ in stored.committed()] == ["step_00000002", "step_00000004"]
    assert stored.fs.cat_file(stored.path("export", "final.safetensors")) == \
        (tmp_path / "first" / "export" / "final.safetensors").read_bytes()
    elsewhere = run_in_process(*run, "trainer.max_steps=6", f"resume={store}/checkpoints/step_00000002",
                               "hydra.run.dir=elsewhere", cwd=tmp_path, capsys=capsys)
    assert elsewhere.returncode == 0, elsewhere.output
    assert (tmp_path / "elsewhere" / "fetched" / "step_00000002" / "manifest.json").is_file()


def test_a_run_whose_every_checkpoint_is_damaged_is_not_told_to_resume(tmp_path, capsys):
    """The final message says what can be done, not "continue with resume=auto" (the command that just failed)
    nor "the last complete checkpoint is step 4" (the damaged one)."""
    from conftest import TINY, run_in_process

    run = (*TINY, "trainer.max_steps=4", "checkpoint.every_n_steps=4", "hydra.run.dir=run")
    assert run_in_process(*run, cwd=tmp_path, capsys=capsys).returncode == 0
    (tmp_path / "run" / "checkpoints" / "step_00000004" / MODEL_FILE).write_bytes(b"truncated")
    resumed = run_in_process(*run, "trainer.max_steps=6", "resume=auto", cwd=tmp_path, capsys=capsys)
    message = resumed.stderr.strip().splitlines()[-1]
    assert resumed.returncode == 1 and "no checkpoint here can be resumed" in message, resumed.output
    assert "the last complete checkpoint" not in message and "resume=auto" not in message


def test_a_new_run_starts_from_another_runs_weights(tmp_path, capsys):
    """checkpoint.init_from: the model starts from those weights (a run dir, a step dir or a file), the rest fresh;
    a path without weights, or weights of another model, are named before training."""
    from safetensors.torch import load_file as read

    from conftest import TINY, read_jsonl, run_in_process

    base = (*TINY, "trainer.max_steps=2", "checkpoint.every_n_steps=2")
    assert run_in_process(*base, "hydra.run.dir=first", cwd=tmp_path, capsys=capsys).returncode == 0
    trained = read(tmp_path / "first" / "export" / "final.safetensors")
    for source, name in [("first", "from_run"), ("first/checkpoints/step_00000002", "from_step")]:
        # lr 0: the step changes nothing, so the export is the weights it started from.
        started = run_in_process(*base, "optimizer.lr=0", f"checkpoint.init_from={source}", f"hydra.run.dir={name}",
                                 cwd=tmp_path, capsys=capsys)
        assert started.returncode == 0, started.output
        assert "the model starts from the weights in" in started.output
        again = read(tmp_path / name / "export" / "final.safetensors")
        assert all(torch.equal(again[key], value) for key, value in trained.items())
        assert [row["step"] for row in read_jsonl(tmp_path / name / "metrics.jsonl") if "train/loss" in row] == [2]
    nowhere = run_in_process(*base, "checkpoint.init_from=nowhere", "hydra.run.dir=x", cwd=tmp_path, capsys=capsys)
    assert nowhere.returncode == 1 and "checkpoint.init_from: is nowhere, which holds no weights" in nowhere.stderr
    other = run_in_process(*base, "model.d_model=32", "checkpoint.init_from=first", "hydra.run.dir=y", cwd=tmp_path,
                           capsys=capsys)
    assert other.returncode == 1 and "checkpoint.init_from: the weights in" in other.stderr
    assert "do not fit this model" in other.stderr


def test_a_resumed_run_takes_its_checkpoints_weights_not_init_from(tmp_path, capsys):
    """The same command with resume=auto continues a preempted fine-tune from its own checkpoint: init_from's
    weights are only where a run starts."""
    from safetensors.torch import load_file as read

    from conftest import TINY, run_in_process

    base = (*TINY, "trainer.max_steps=2", "checkpoint.every_n_steps=2")
    for name, seed in (("a", 0), ("b", 1)):  # two sets of weights
        made = run_in_process(*base, f"seed={seed}", f"hydra.run.dir={name}", cwd=tmp_path, capsys=capsys)
        assert made.returncode == 0, made.output
    # lr 0: every checkpoint and export holds the weights the run started from.
    tune = (*TINY, "optimizer.lr=0", "checkpoint.every_n_steps=2", "hydra.run.dir=tune")
    assert run_in_process(*tune, "trainer.max_steps=2", "checkpoint.init_from=a", cwd=tmp_path,
                          capsys=capsys).returncode == 0
    resumed = run_in_process(*tune, "trainer.max_steps=4", "checkpoint.init_from=b", "resume=auto", cwd=tmp_path,
                             capsys=capsys)
    assert resumed.returncode == 0, resumed.output
    final, a, b = (read(tmp_path / name / "export" / "final.safetensors") for name in ("tune", "a", "b"))
    assert not all(torch.equal(b[key], value) for key, value in a.items())  # b's weights would show
    assert all(torch.equal(final[key], value) for key, value in a.items())
