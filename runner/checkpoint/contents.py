"""Writing a model's weights and reading what a checkpoint holds, for the loop's Checkpointer (resume) and the
Accelerator's save_state/load_state alike: the state file weights-only (plain data; pickled code is refused and never
runs), the weights with safetensors (no pickle at all), each failure as one message naming the file and what to do."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model, save_file, save_model
from torch import nn

from runner.errors import CheckpointError, first_line


def load_plain_state(file: Path, caller: str, advice: str, *, mmap: bool = False,
                     refusal: type[CheckpointError] = CheckpointError) -> dict:
    """torch.load(weights_only=True) of `file`, on the CPU. `caller` starts the message ("resume", "load_state"),
    `advice` ends it; `refusal` is the error raised (ResumeRefused where resume=auto would meet the same file)."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as err:  # weights_only refuses what is not plain data (pickled code); a garbled file fails too
        raise refusal(f"{caller}: {file} cannot be loaded safely ({type(err).__name__}: {first_line(err)}); it was "
                      f"altered after it was written, or not written by the runner. {advice}") from None


def load_weights(file: Path, model: nn.Module, caller: str) -> None:
    """Every tensor of the safetensors `file` into `model`, which must have exactly those names and shapes."""
    try:
        missing, unexpected = (load_model(model, str(file), strict=False) if _on_host_devices(model)
                               else _load_into_device_model(model, file))
    except Exception as err:  # a shape mismatch (RuntimeError), or a file safetensors cannot parse
        first = str(err).strip().splitlines()
        raise CheckpointError(f"{caller}: the weights in {file} do not fit this model: "
                              f"{' '.join(line.strip() for line in first[:3])}") from err
    if missing or unexpected:
        raise CheckpointError(f"{caller}: the weights in {file} do not fit this model: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}")


def init_weights_file(path: str) -> Path:
    """The weights file checkpoint.init_from names: a .safetensors file, a checkpoint dir's model.safetensors, or a
    run dir's export/final.safetensors (absolute, so that every process reads the same one)."""
    from runner.errors import ConfigError

    given = Path(path).expanduser()
    for candidate in (given, given / "model.safetensors", given / "export" / "final.safetensors"):
        if candidate.is_file() and candidate.suffix == ".safetensors":
            return candidate.resolve()
    sharded = (given / ".metadata").is_file()
    raise ConfigError("checkpoint.init_from", f"is {path}, which " + (
        "is a sharded checkpoint (parallel=fsdp): give its run's export/final.safetensors, whole weights" if sharded
        else "holds no weights: give a .safetensors file, a checkpoints/step_N dir or a run dir with "
             "export/final.safetensors"))


def save_weights(model: nn.Module, file: Path) -> None:
    """The model's state dict as safetensors, tied weights once (safetensors' save_model). An XLA model's tensors
    have no host memory for safetensors to read: they are copied to the CPU first (torch_xla's xm.save does the
    same), tied names sharing one copy, and written as save_model writes them: the alphabetically first name of a
    tied group kept, the others named in the metadata."""
    if _on_host_devices(model):
        save_model(model, str(file))
        return
    state = model.state_dict(keep_vars=True)
    names_of: dict[int, list[str]] = {}
    for name, value in state.items():
        names_of.setdefault(id(value), []).append(name)
    weights, metadata = {}, {}
    for names in names_of.values():
        kept, *others = sorted(names)
        weights[kept] = state[kept].detach().cpu().contiguous()
        metadata.update({other: kept for other in others})
    save_file(weights, str(file), metadata=metadata or None)


def on_host(tree):
    """`tree` (a state dict, nested dicts, lists and tuples) with tensors of devices torch.save cannot write portably
    (XLA: saved, they would load back onto an XLA device even with map_location="cpu") copied to the CPU; the same
    object when it has none, so CPU and CUDA runs save what they saved before."""
    if not _holds_device_tensors(tree):
        return tree
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return type(tree)((key, on_host(value)) for key, value in tree.items())
    return type(tree)(on_host(value) for value in tree)


def _holds_device_tensors(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.device.type not in HOST_DEVICES
    if isinstance(tree, dict):
        return any(_holds_device_tensors(value) for value in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(_holds_device_tensors(value) for value in tree)
    return False


HOST_DEVICES = ("cpu", "cuda", "meta")
"""Devices whose tensors safetensors and torch.save read directly; others (XLA) go through a CPU copy."""


def _on_host_devices(model: nn.Module) -> bool:
    return all(value.device.type in HOST_DEVICES for value in model.state_dict(keep_vars=True).values())


def _load_into_device_model(model: nn.Module, file: Path) -> tuple[list[str], list[str]]:
    """load_model for a model on XLA (safetensors' reads the storage of each of its tensors): the file's tensors
    copied in by load_state_dict; a name tied to a loaded one (save_weights kept one name per tied group) is not
    missing."""
    from safetensors.torch import load_file

    loaded = load_file(str(file))
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    state = model.state_dict(keep_vars=True)
    filled = {id(state[name]) for name in loaded if name in state}
    return [name for name in missing if id(state[name]) not in filled], list(unexpected)
