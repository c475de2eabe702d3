"""Precision: the autocast dtype and context, the gradient scaler, and fp8 conversion, for one device type."""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext
from types import MethodType

import torch
from torch import nn

from runner.config import PrecisionKind
from runner.errors import HardwareError, Problem
from runner.ground import install_hint

AUTOCAST_DTYPES = {
    PrecisionKind.fp32: None,
    PrecisionKind.bf16: torch.bfloat16,
    PrecisionKind.fp16: torch.float16,
    # fp8 matmuls come from torchao's Float8Linear; the rest of the model runs under bf16 autocast.
    PrecisionKind.fp8: torch.bfloat16,
}
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with fp8 tensor cores
_NO_AUTOCAST = nullcontext()  # reusable: fp32 enters it every micro-step, so no new object each time


class Precision:
    """What `precision=...` means on a device: `autocast()`, whether a GradScaler is needed, fp8 conversion."""

    def __init__(self, kind: PrecisionKind | str, device_type: str):
        self.kind = PrecisionKind(kind)
        self.device_type = device_type
        self.autocast_dtype = AUTOCAST_DTYPES[self.kind]
        self.fp8_modules = 0

    def autocast(self):
        if self.autocast_dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        """fp16 gradients underflow without loss scaling; the scaler also skips steps with inf/nan gradients."""
        if self.kind is not PrecisionKind.fp16:
            return None
        return torch.amp.GradScaler(self.device_type)

    def convert(self, model: nn.Module) -> nn.Module:
        """Under fp8, swap eligible Linear layers for torchao's Float8Linear, in place (parameters are kept, so an
        optimizer built before still holds the right tensors; build it after anyway, as torchao recommends)."""
        if self.kind is not PrecisionKind.fp8:
            return model
        try:
            from torchao.float8 import convert_to_float8_training
            from torchao.float8.float8_linear import Float8Linear
        except ImportError as err:
            raise HardwareError(f"precision=fp8 needs torchao, which failed to import ({err}); {install_hint('fp8')}") from err

        def not_yet_converted(module: nn.Module, fqn: str) -> bool:
            # Float8Linear is a Linear too: skipping it makes converting twice (worker, then prepare) a no-op.
            return fp8_eligible(module, fqn) and not isinstance(module, Float8Linear)

        before = sum(isinstance(module, Float8Linear) for module in model.modules())
        convert_to_float8_training(model, module_filter_fn=not_yet_converted)
        self.fp8_modules += sum(isinstance(module, Float8Linear) for module in model.modules()) - before
        return model

    def describe(self) -> str:
        dtype = str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else "off"
        text = f"precision {self.kind.value} | autocast {dtype} | grad scaler {'on' if self.kind is PrecisionKind.fp16 else 'off'}"
        return text + (f" | fp8 modules converted {self.fp8_modules}" if self.kind is PrecisionKind.fp8 else "")

    def speed_warning(self) -> str | None:
        """Why this precision is known to run slower than fp32 on this device, or None."""
        if self.device_type == "cpu" and self.kind is PrecisionKind.fp8:
            return ("precision=fp8 on a CPU is emulated, far slower than fp32 (4x on the project's AVX2 machine, over "
                    "30x on an AVX512 one): use it only to test the code path")
        if self.device_type == "cpu" and self.autocast_dtype is torch.bfloat16 and not cpu_has_native_bf16():
            return (
                f"precision={self.kind.value} on this CPU ({torch.backends.cpu.get_cpu_capability()}, no native bf16 "
                "matmul) runs slower than fp32 (about 4x on AVX2): use it to check correctness, not for speed"
            )
        if self.device_type == "cpu" and self.autocast_dtype is torch.float16:
            return "precision=fp16 on a CPU runs slower than fp32 (about 3x on AVX2): use it to check correctness"
        return None


def fp8_eligible(module: nn.Module, fqn: str) -> bool:
    """float8 matmuls need both dimensions divisible by 16; other layers stay in high precision."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 / AMX CPUs run bf16 matmuls natively; AVX2 ones convert and run slower than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")


def cuda_fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= FP8_MIN_CAPABILITY


def cpu_autocast_runs(dtype: torch.dtype) -> bool:
    """Probe: does a Linear forward/backward run under CPU autocast to this dtype on this torch build?"""
    try:
        layer = nn.Linear(4, 4)
        with torch.autocast("cpu", dtype=dtype):
            layer(torch.ones(2, 4)).float().sum().backward()
    except RuntimeError:
        return False
    return True


def precision_problems(kind: PrecisionKind, fp8_emulation: bool, device_type: str) -> list[Problem]:
    """What this device lacks for the chosen precision (device_type: cpu, cuda or xla)."""
    problems = []
    if kind is PrecisionKind.fp16 and device_type == "xla":
        problems.append(Problem("precision", "fp16 is not supported on TPU (no gradient scaler there); use precision=bf16"))
    if kind in (PrecisionKind.fp16, PrecisionKind.bf16) and device_type == "cpu":
        if not cpu_autocast_runs(AUTOCAST_DTYPES[kind]):
            problems.append(
                Problem("precision", f"{kind.value} autocast does not run on this CPU with torch {torch.__version__}; use precision=fp32")
            )
    if kind is PrecisionKind.fp8:
        problems += _fp8_problems(fp8_emulation, device_type)
    return problems


def _fp8_problems(fp8_emulation: bool, device_type: str) -> list[Problem]:
    problems = [] if fp8_emulation else _fp8_device_problems(device_type)
    if importlib.util.find_spec("torchao") is None:
        problems.insert(0, Problem("precision", f"fp8 needs torchao, which is not installed; {install_hint('fp8')}"))
    elif not problems:
        # fp8 will run: torchao must import too (one built for another torch fails here). Not before: importing it
        # prints several lines of its own (kernels it cannot load on this machine) ahead of the device's refusal.
        try:
            import torchao.float8  # noqa: F401
        except ImportError as err:
            problems.append(Problem("precision", f"fp8 needs torchao, which failed to import ({err}); {install_hint('fp8')}"))
    return problems


def _fp8_device_problems(device_type: str) -> list[Problem]:
    if device_type != "cuda" or not torch.cuda.is_available():
        where = "has no usable CUDA GPU" if device_type == "cuda" else f"runs on {device_type}"
        return [Problem(
            "precision.fp8_emulation",
            f"precision=fp8 needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper or newer) and this run "
            f"{where}; use precision=bf16, or set precision.fp8_emulation=true to run the fp8 code path "
            "slowly, only to test it",
        )]
    if not cuda_fp8_capable():
        major, minor = torch.cuda.get_device_capability()
        return [Problem(
            "precision.fp8_emulation",
            f"precision=fp8 needs compute capability >= 8.9 and {torch.cuda.get_device_name()} has {major}.{minor}; "
            "use precision=bf16, or set precision.fp8_emulation=true to test the code path",
        )]
    return []


LOW_PRECISION = (torch.float16, torch.bfloat16)


def autocast_forward(model: nn.Module, autocast) -> None:
    """Run `model`'s forward under `autocast()` and return its floating outputs in fp32, as Accelerate's prepare
    does under mixed precision (Accelerator(autocast_forward=...) says who wants it). The original forward is kept
    as `model._original_forward`, Accelerate's name, for plain_forward (unwrap_model(keep_fp32_wrapper=False))."""
    from runner.accelerate.prepared import tree_map

    if "_original_forward" in model.__dict__:  # prepared twice: one wrapper is enough
        return
    forward = model.forward
    model._original_forward = forward
    # Bound to the model, as Accelerate binds its own: a deepcopy of the model (an EMA copy) then runs the copy's
    # forward, not this one's.
    function = getattr(forward, "__func__", None)

    def forward_in_precision(self, *args, **kwargs):
        with autocast():
            outputs = function(self, *args, **kwargs) if function is not None else forward(*args, **kwargs)
        return tree_map(lambda tensor: tensor.float() if tensor.dtype in LOW_PRECISION else tensor, outputs)

    model.forward = MethodType(forward_in_precision, model)


def plain_forward(model: nn.Module) -> None:
    """Undo autocast_forward: the model's own forward again."""
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    if getattr(original, "__self__", None) is model and getattr(original, "__func__", None) is type(model).forward:
        model.__dict__.pop("forward", None)  # the class's forward again, as before prepare
    else:
        model.forward = original
