"""How a model is shared by several processes, and what is done to its blocks before: activation checkpointing
and torch.compile.

- DDP: every process holds the whole model; gradients are averaged.
- FSDP (torch.distributed.fsdp.fully_shard, "FSDP2"): each process holds 1/N of every parameter, its gradient and
  its optimizer state; a block's parameters are all-gathered just before its forward (and backward) and freed
  after, so a model N times larger than one device's share fits. The parameters become DTensors, in place: the
  module keeps its class's behaviour and its parameter names.

"Blocks" are the repeated layers of a model: by default each element of every nn.ModuleList (a transformer's
layers), or the classes named in the config. FSDP shards each block as one unit, activation checkpointing
recomputes each block's activations in backward, and under FSDP torch.compile compiles each block.

`DistributedDataParallelKwargs` is Accelerate's name for the DDP settings, for hand-written loops:
`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import torch
from torch import nn

from runner.config import (
    ActivationCheckpointingConfig, CompileConfig, ParallelConfig, ParallelKind, PrecisionKind,
)
from runner.errors import ConfigError, Problem

log = logging.getLogger(__name__)

# precision -> FSDP's MixedPrecisionPolicy dtypes (compute, gradient reduction); fp32 needs no policy. fp16 and fp8
# are refused with FSDP by runner/run/checks.py.
FSDP_PRECISION = {PrecisionKind.bf16: (torch.bfloat16, torch.float32)}


@dataclass
class DistributedDataParallelKwargs:
    """Accelerate's kwargs handler for DDP; the fields mean what runner.config.ParallelConfig's do."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float | None = None
    broadcast_buffers: bool = True

    def to_config(self) -> ParallelConfig:
        return ParallelConfig(kind=ParallelKind.ddp, **{item.name: getattr(self, item.name) for item in fields(self)})


def settings_of(parallel: ParallelConfig | ParallelKind | str | None) -> ParallelConfig:
    """`Accelerator(parallel=...)`: a ParallelConfig, or just its kind ("ddp", "fsdp", "none")."""
    if parallel is None or isinstance(parallel, ParallelConfig):
        return parallel or ParallelConfig()
    try:
        return ParallelConfig(kind=ParallelKind(parallel))
    except ValueError:
        raise ConfigError("parallel", f"is {parallel!r}; use one of {', '.join(kind.value for kind in ParallelKind)}, "
                                      "or a runner.ParallelConfig") from None


def chosen_settings(parallel: ParallelConfig | ParallelKind | str | None, ddp: ParallelConfig | None) -> ParallelConfig:
    """What `Accelerator(parallel=..., kwargs_handlers=[DistributedDataParallelKwargs(...)])` asks for: the handler's
    DDP settings under parallel="ddp" (or no parallel), refused where they would be dropped without a word."""
    if ddp is None:
        return settings_of(parallel)
    if parallel is None:
        return ddp
    if isinstance(parallel, ParallelConfig):
        raise ConfigError("Accelerator(kwargs_handlers)", (
            "a DistributedDataParallelKwargs and a ParallelConfig both set how the model is shared; give DDP's "
            "settings in one of them"))
    kind = settings_of(parallel).kind
    if kind != ParallelKind.ddp:
        raise ConfigError("Accelerator(kwargs_handlers)", (
            f"a DistributedDataParallelKwargs holds DDP's settings, and parallel is '{kind.value}', which does not "
            "use them; drop the handler or use parallel='ddp'"))
    return ddp


def shards(settings: ParallelConfig, distributed: bool) -> bool:
    """Whether the parameters are sharded across processes (FSDP on more than one process)."""
    return distributed and settings.kind == ParallelKind.fsdp


def ddp_arguments(settings: ParallelConfig) -> dict:
    """The settings that differ from DDP's defaults (torch 2.13 warns about broadcast_buffers passed at all)."""
    defaults = ParallelConfig()
    names = ("find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "broadcast_buffers")
    return {name: getattr(settings, name) for name in names if getattr(settings, name) != getattr(defaults, name)}


def wrap(model: nn.Module, settings: ParallelConfig, device: torch.device, distributed: bool, *,
         world_size: int = 1, precision: PrecisionKind = PrecisionKind.fp32) -> nn.Module:
    """The model as the processes share it (unchanged in a single process). FSDP moves each unit's shards to
    `device` as it shards it, so the whole model is never on one device; DDP expects the model there already."""
    if not distributed or settings.kind == ParallelKind.none:
        return model
    if settings.kind == ParallelKind.fsdp:
        return fully_shard(model, settings, device, world_size, precision)
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **ddp_arguments(settings))


def fully_shard(model: nn.Module, settings: ParallelConfig, device: torch.device, world_size: int,
                precision: PrecisionKind) -> nn.Module:
    """Shard each block, then the model itself (the unit of whatever the blocks leave: embeddings, head), in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as shard

    if device.type == "cuda":
        torch.cuda.set_device(device)  # the mesh's device is the current one
    options = {"mesh": init_device_mesh(device.type, (world_size,)),
               "reshard_after_forward": settings.reshard_after_forward}
    if precision in FSDP_PRECISION:
        compute, reduce = FSDP_PRECISION[precision]
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)
    if settings.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    blocks = find_blocks(model, settings.shard_modules, "parallel.shard_modules", required=False)
    # Named before sharding: fully_shard swaps each module's class for an FSDP<Name> subclass.
    names = f" ({type(_inner(blocks[0][2])).__name__})" if blocks else ""
    for _, _, block in blocks:
        shard(block, **options)
    shard(model, **options)
    log.info("fsdp: %d block(s) and the model sharded over %d processes%s", len(blocks), world_size, names)
    return model


def follow_replaced_parameters(optimizer, replaced: dict[int, tuple]) -> None:
    """Point the optimizer's parameter groups at the parameters that replaced theirs in prepare (FSDP's shards, a
    model's parameters on an XLA device; `replaced`: old parameter's id -> (weak reference to it, the new one), as
    runner.Accelerator records them)."""

    def new(param):
        reference, sharded = replaced.get(id(param), (None, None))
        return sharded if reference is not None and reference() is param else None

    if any(new(param) is not None and param in optimizer.state
           for group in optimizer.param_groups for param in group["params"]):
        raise TypeError("Accelerator.prepare(): this optimizer already stepped on parameters that preparing the "
                        "model replaced (FSDP shards them; an XLA device gets new ones): prepare it with the model, "
                        "before training")
    for group in optimizer.param_groups:
        group["params"] = [new(param) if new(param) is not None else param for param in group["params"]]


def is_sharded(model: nn.Module) -> bool:
    """Whether fully_shard turned this module's parameters into DTensor shards."""
    return any(type(parameter).__name__ == "DTensor" for parameter in model.parameters())


# -- blocks -------------------------------------------------------------------------------------------------------


def find_blocks(model: nn.Module, class_names: list[str] | None, key: str,
                required: bool = True) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, name in the parent, block) of each block, outermost only (a block inside a block is part of it):
    modules of the named classes, or (None) each element with parameters of every nn.ModuleList. A named class the
    model lacks is a ConfigError naming `key`; so is finding no block at all when `required`."""
    found, inside, lists = [], None, _module_lists(model)
    for name, module in model.named_modules():  # depth first: a block's descendants come right after it
        if inside and name.startswith(inside):
            continue
        if class_names is None:
            is_block = bool(name) and _parent_name(name) in lists and any(True for _ in module.parameters())
        else:
            is_block = bool(name) and type(_inner(module)).__name__ in class_names
        if is_block:
            found.append((model.get_submodule(_parent_name(name)), name.rsplit(".", 1)[-1], module))
            inside = name + "."
    missing = sorted(set(class_names or ()) - {type(_inner(block)).__name__ for _, _, block in found})
    if missing or (required and not found):
        classes = sorted({type(module).__name__ for module in model.modules()} - {"ModuleList", "Sequential"})
        what = (f"names {', '.join(missing)}, which the model has no module of" if missing
                else "is null (every block of each nn.ModuleList), and the model has no nn.ModuleList")
        raise ConfigError(key, f"{what}; name the block classes to use, e.g. {key}=[{classes[0]}], among the "
                               f"model's module classes: {', '.join(classes)}")
    return found


def _module_lists(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if isinstance(module, nn.ModuleList)}


def _parent_name(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _inner(module: nn.Module) -> nn.Module:
    """The module inside the wrappers runner puts around blocks (torch.compile's, activation checkpointing's)."""
    for attribute in ("_orig_mod", "_checkpoint_wrapped_module"):
        if hasattr(module, attribute):
            return _inner(getattr(module, attribute))
    return module


def prepare_blocks(model: nn.Module, checkpointing: ActivationCheckpointingConfig, compiling: CompileConfig,
                   parallel: ParallelConfig, sharded: bool) -> nn.Module:
    """Activation checkpointing, then torch.compile, before the model is sharded (the order torchtitan uses:
    FSDP's hooks must stay outside the compiled code). The model keeps its identity and its parameter names."""
    if checkpointing.enabled:
        checkpoint_blocks(model, checkpointing.modules)
    if compiling.enabled:
        compile_model(model, compiling, parallel.shard_modules if sharded else None, sharded)
    return model


def checkpoint_blocks(model: nn.Module, class_names: list[str] | None) -> int:
    """Recompute each block's activations in backward: each block is replaced in its parent by torch's
    checkpoint wrapper (the one torchtitan uses: torch.compile traces it, unlike the hook-based `checkpoint`, whose
    eager recomputation does not match a compiled forward). Its state dict hooks drop the wrapper's part of the
    names, so the model's state dict keeps its keys. Returns how many blocks."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    blocks = find_blocks(model, class_names, "activation_checkpointing.modules")
    for parent, name, block in blocks:
        parent.register_module(name, checkpoint_wrapper(block))
    log.info("activation checkpointing: %d block(s) (%s)", len(blocks), type(_inner(blocks[0][2])).__name__)
    return len(blocks)


def compile_model(model: nn.Module, settings: CompileConfig, shard_modules: list[str] | None, sharded: bool) -> None:
    """Unsharded: the whole model compiles in place (Module.compile: no wrapper, no `_orig_mod.` in its names).
    Sharded: each block is replaced in its parent by its torch.compile wrapper, which FSDP then shards, so FSDP's
    gathers run between compiled blocks; sharded checkpoints and exports drop the wrapper's `_orig_mod.` (see
    runner/checkpoint/sharded.py). Either way the module given is the module trained."""
    options = {"backend": settings.backend, "mode": settings.mode, "fullgraph": settings.fullgraph}
    if not sharded:
        # wrap_top_frame: without it Module.compile captures nothing for a model whose forward is torch.nn's own
        # (an nn.Sequential such as runner.models.MLP): dynamo skips frames in torch/nn as the top frame (measured).
        with torch._dynamo.config.patch(wrap_top_frame=True):
            model.compile(**options)
        log.info("torch.compile: the model (backend %s)", settings.backend)
        return
    blocks = find_blocks(model, shard_modules, "parallel.shard_modules")
    for parent, name, block in blocks:
        parent.register_module(name, torch.compile(block, **options))
    log.info("torch.compile: %d block(s), one by one (backend %s)", len(blocks), settings.backend)


def cxx_compiler() -> str | None:
    """The C++ compiler torch's inductor would use on a CPU, or None when there is none."""
    from torch._inductor import cpp_builder, exc

    try:
        return cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return None


def compile_problems(settings: CompileConfig, device_type: str) -> list[Problem]:
    """A backend or mode torch.compile does not know, or inductor on a CPU without a C++ compiler."""
    if not settings.enabled:
        return []
    import torch._dynamo
    import torch._inductor

    problems = []
    backends = torch._dynamo.list_backends(exclude_tags=())
    if settings.backend not in backends:
        problems.append(Problem("compile.backend", f"is {settings.backend!r}; torch.compile knows "
                                                   f"{', '.join(name for name in backends if 'TESTING' not in name)}"))
    modes = list(torch._inductor.list_mode_options())
    if settings.mode is not None and settings.mode not in modes:
        problems.append(Problem("compile.mode", f"is {settings.mode!r}; use one of {', '.join(modes)}, or null"))
    if settings.backend == "inductor" and device_type == "cpu" and cxx_compiler() is None:
        problems.append(Problem("compile.backend", "is inductor, which on a CPU compiles C++ kernels, and no C++ "
                                "compiler was found (looked for $CXX, g++, clang++ ...); install one (e.g. apt-get "
                                "install g++), set compile.backend=aot_eager to compile without generated code, or "
                                "compile.enabled=false"))
    return problems


def parallel_problems(settings: ParallelConfig, precision: PrecisionKind, device_type: str) -> list[Problem]:
    """FSDP settings that cannot work on this device or with this precision."""
    if settings.kind != ParallelKind.fsdp:
        return []
    problems = []
    if precision in (PrecisionKind.fp16, PrecisionKind.fp8):
        # fp16's gradient scaler would look for inf/nan in each rank's shard alone, so ranks could disagree on
        # skipping a step; fp8's float8 all-gathers are not wired here.
        problems.append(Problem("precision", f"is {precision.value}, which parallel=fsdp does not support; use "
                                             "precision=bf16 (FSDP keeps fp32 shards, computes in bf16 and reduces "
                                             "gradients in fp32) or fp32, or parallel=ddp"))
    if settings.cpu_offload and device_type != "cuda":
        problems.append(Problem("parallel.cpu_offload", f"moves the shards from the GPUs to CPU memory, and this "
                                                        f"run is on {device_type}; set it false"))
    return problems


UNUSED_PARAMETER_WORDS = ("Expected to have finished reduction in the prior iteration",
                          "did not receive grad", "find_unused_parameters")


def unused_parameters_hint(err: BaseException) -> str | None:
    """The fix for DDP's error about parameters that got no gradient, or None for any other error."""
    if any(words in str(err) for words in UNUSED_PARAMETER_WORDS):
        return ("some parameters of the model got no gradient in a step (a branch the forward skipped), which DDP "
                "cannot average; set parallel.find_unused_parameters=true (or parallel.static_graph=true when the "
                "same parameters are unused every step)")
    return None
