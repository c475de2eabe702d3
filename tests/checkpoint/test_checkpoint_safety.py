"""What a checkpoint can do to the machine that loads it: nothing but hand over tensors and plain values. An altered
checkpoint, resealed so that its hashes match, is refused with one message, and nothing it names is run."""

from __future__ import annotations

import pickle

import pytest
import torch

from runner.checkpoint import find_resume, sharded
from runner.training.checkpointer import Checkpointer, restore
from runner.checkpoint import safe_dcp
from runner.training.checkpointer import read_config
from runner.checkpoint.files import Layout
from runner.config import CheckpointConfig, MonitorMode
from runner.errors import CheckpointError
from checkpoint_helpers import RESOLVED, TouchesAFile, reseal, trained_objects  # shared with load_state's tests


def _sharded_run(run_dir, steps=(1, 2)):
    """A run dir with sharded (parallel=fsdp layout) checkpoints, written by one process."""
    model, optimizer = trained_objects()
    checkpointer = Checkpointer(run_dir, CheckpointConfig(), writer=True, monitor="val/accuracy",
                                monitor_mode=MonitorMode.max, world_size=1, resolved=RESOLVED, layout=Layout.dcp)
    for step in steps:
        checkpointer.save(model, {"loop": {"step": step}}, {"step": step, "epoch": 0, "batch_in_epoch": step}, {},
                          optimizer=optimizer)
        checkpointer.wait()
    return run_dir / "checkpoints"


def _plant_in_metadata(checkpoint, payload):
    """The genuine metadata with `payload` tucked inside it: it still loads normally if the payload runs."""
    metadata = safe_dcp.read_metadata(checkpoint)
    metadata.storage_meta.modules = [payload]
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    reseal(checkpoint)


def test_resealed_code_in_metadata_is_refused(tmp_path):
    """Resealed metadata that runs code is refused on resume=auto, and named, and nothing runs."""
    checkpoints = _sharded_run(tmp_path / "run")
    marker = tmp_path / "ran"
    _plant_in_metadata(checkpoints / "step_00000002", TouchesAFile(marker))
    with open(checkpoints / "step_00000002" / ".metadata", "rb") as handle:  # plain pickle would have run it
        assert b"touch" in handle.read()

    expected = (rf"resume: {checkpoints / 'step_00000002' / '.metadata'} holds code or objects the runner will not "
                r"load \(UnpicklingError: global 'pathlib.Path.touch' is not DCP metadata\); .* Nothing in it was "
                r"run. Resume from resume=<run dir>/checkpoints/step_00000001, the one before it; do not trust")
    with pytest.raises(CheckpointError, match=expected):
        find_resume("auto", tmp_path / "run")
    with pytest.raises(CheckpointError, match=expected):
        find_resume(str(checkpoints / "step_00000002"), tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=expected):  # a worker loading it directly: refused the same way
        restore(checkpoints / "step_00000002", *trained_objects(seed=1), world_size=1)
    assert not marker.exists()

    # The checkpoint the message names is genuine and loads (through the same restricted reader).
    assert find_resume(str(checkpoints / "step_00000001"), tmp_path / "elsewhere") == checkpoints / "step_00000001"
    model, optimizer = trained_objects()
    fresh, fresh_optimizer = trained_objects(seed=1)
    restore(checkpoints / "step_00000001", fresh, fresh_optimizer, world_size=1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1  # a non-tensor value, read weights-only


@pytest.mark.parametrize("payload", ["os.system", "builtins.eval", "not a pickle"])
def test_foreign_globals_and_garbage_are_refused(tmp_path, payload):
    """Any global outside DCP metadata, and a garbled file, are refused."""
    checkpoint = _sharded_run(tmp_path / "run", steps=(1,)) / "step_00000001"
    if payload == "not a pickle":
        (checkpoint / ".metadata").write_bytes(b"garbage")
    else:
        module, name = payload.split(".")
        # GLOBAL 'module name', then an argument and REDUCE: what a crafted pickle calls.
        (checkpoint / ".metadata").write_bytes(
            b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x04\x00\x00\x00trueq\x00\x85q\x01Rq\x02.")
    reseal(checkpoint)
    with pytest.raises(CheckpointError, match=r"holds code or objects the runner will not load .* Resume from "
                                              r"another run's checkpoint, or start a new run"):
        find_resume("auto", tmp_path / "run")


def test_non_tensor_shard_values_load_weights_only(tmp_path):
    """DCP keeps non-tensor values (the optimizer's hyperparameters) as pickles inside the shards, which its default
    planner loads with weights_only=False."""
    import torch.distributed.checkpoint as dcp

    model, optimizer = trained_objects()
    marker = tmp_path / "ran"
    state = {"model": sharded.model_state(model), "optimizer": sharded.optimizer_state(model, optimizer)}
    state["optimizer"]["param_groups"][0]["lr"] = TouchesAFile(marker)
    dcp.save(state, checkpoint_id=str(tmp_path / "step_00000001"), no_dist=True)
    with pytest.raises(CheckpointError, match=r"a value in the shards \(__<rank>_0.distcp\) of .*step_00000001 holds "
                                              r"code or objects the runner will not load \(UnpicklingError: "):
        sharded.load(tmp_path / "step_00000001", {"model": (model, None), "optimizer": (model, optimizer)}, False)
    assert not marker.exists()


def test_python_tag_in_config_yaml_runs_nothing(tmp_path):
    """A python tag in a checkpoint's config.yaml is one message and runs nothing."""
    checkpoints = _sharded_run(tmp_path / "run", steps=(1,))
    marker = tmp_path / "ran"
    config = checkpoints / "step_00000001" / "config.yaml"
    config.write_text(f'seed: 0\nmodel: !!python/object/apply:os.system ["touch {marker}"]\n')
    reseal(config.parent)
    expected = (rf"{config} is not plain YAML data at line 2 \(could not determine a constructor for the tag "
                r"'tag:yaml.org,2002:python/object/apply:os.system'\): .* nothing in it was run")
    with pytest.raises(CheckpointError, match=expected):
        read_config(config)
    with pytest.raises(CheckpointError, match=expected):  # read when the config changed since the checkpoint
        restore(config.parent, *trained_objects(seed=1), world_size=1, resolved={**RESOLVED, "seed": 1})
    from runner.commands.sample import load_model

    with pytest.raises(CheckpointError, match=expected):
        load_model(config.parent / "model.safetensors", config)
    assert not marker.exists()


class RunsWhenUnpickled:
    """A pickle that leaves a marker file when it is loaded without weights_only."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _run_dir_config(tmp_path, model: dict, allowed_targets: list[str]):
    """The config.yaml a run dir (someone else's, perhaps) holds beside its weights."""
    import yaml

    config = tmp_path / "run" / "export" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump({"model": model, "allowed_targets": allowed_targets}))
    return config


def test_a_run_dirs_config_cannot_widen_what_sample_builds(tmp_path):
    """`runner sample` builds the model a run dir's config names only under the prefixes the command allows: the
    config's own allowed_targets is data, and it does not widen them."""
    from runner.commands.sample import load_model, parse
    from runner.errors import ConfigError

    (tmp_path / "evilpkg.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w')\nclass Model: pass\n")
    config = _run_dir_config(tmp_path, {"_target_": "evilpkg.Model"}, ["runner.", "torch.", "evilpkg."])
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        with pytest.raises(ConfigError, match=r"allowed_targets: model._target_ in .*config.yaml is 'evilpkg.Model', "
                                              r"outside the prefixes `runner sample` allows \(runner., torch., .*\); "
                                              r"a run dir's own allowed_targets cannot widen them.*"
                                              r"allowed_targets=\[runner.,torch.,.*,evilpkg.\]"):
            load_model(config.parent / "final.safetensors", config)
    assert not (tmp_path / "imported").exists()
    # Allowed on the command line, the user's own package builds (and the weights are what is missing here).
    _, settings = parse(["run", "allowed_targets=[runner.,evilpkg.]"])
    assert settings.allowed_targets == ["runner.", "evilpkg."]


def test_sample_refuses_torch_load_by_another_path_and_runs_nothing(tmp_path):
    """torch.load without weights_only, named through another module's namespace, is refused before it runs."""
    from runner.commands.sample import load_model
    from runner.errors import ConfigError

    marker, payload = tmp_path / "ran", tmp_path / "evil.pt"
    torch.save(RunsWhenUnpickled(marker), payload)
    model = {"_target_": "torch.functional.torch.load", "f": str(payload), "weights_only": False}
    config = _run_dir_config(tmp_path, model, ["runner.", "torch."])
    with pytest.raises(ConfigError, match=r"'torch.functional.torch.load' \(that is torch.load\) without weights_only"):
        load_model(config.parent / "final.safetensors", config)
    assert not marker.exists()


@pytest.mark.parametrize("model", [
    # torch's launcher runs a command line; torch.save writes over the file it is given.
    {"_target_": "torch.distributed.run.main", "args": ["--nproc_per_node=1", "--no-python", "touch", "{marker}"]},
    {"_target_": "torch.save", "obj": "x", "f": "{marker}"},
    # A function under the allow-list that is refused by no name: a run dir's config builds with classes only.
    {"_target_": "torch.nn.init.zeros_", "tensor": "{marker}"},
], ids=["launcher", "save", "function"])
def test_sample_builds_a_run_dirs_model_from_classes_only(tmp_path, model):
    """A run dir is data: its config's targets (under torch., which `runner sample` allows) may not act on files or
    processes. The helper that found this had a marker file made by the launcher and a file overwritten by save."""
    from runner.commands.sample import load_model
    from runner.errors import ConfigError

    marker = tmp_path / "ran"
    model = {key: ([item.format(marker=marker) for item in value] if isinstance(value, list)
                   else value.format(marker=marker)) for key, value in model.items()}
    config = _run_dir_config(tmp_path, model, ["runner.", "torch."])
    with pytest.raises(ConfigError, match=r"model._target_: .*(runs arbitrary code or commands|which is not a class)"):
        load_model(config.parent / "final.safetensors", config)
    assert not marker.exists()


def test_sample_builds_classes_and_model_factories(tmp_path):
    """What a run dir's config legitimately names passes: a model class with a nested class, the runner's own model
    functions, and transformers' from_config."""
    from runner.config.instantiate import data_target_problems

    model = {"_target_": "runner.models.GPT", "norm": {"_target_": "torch.nn.LayerNorm", "normalized_shape": 4}}
    assert data_target_problems("model", model, "config.yaml") == []
    assert data_target_problems("model", {"_target_": "runner.models.from_pretrained"}, "config.yaml") == []
    pytest.importorskip("transformers")
    factory = {"_target_": "transformers.AutoModelForCausalLM.from_config",
               "config": {"_target_": "transformers.GPT2Config"}}
    assert data_target_problems("model", factory, "config.yaml") == []
