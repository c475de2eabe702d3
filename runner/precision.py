"""Precision: the autocast dtype and context, and the gradient scaler, for one device type."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from runner.config import PrecisionKind

AUTOCAST_DTYPES = {
    PrecisionKind.fp32: None,
    PrecisionKind.bf16: torch.bfloat16,
    PrecisionKind.fp16: torch.float16,
    # fp8 matmuls come from torchao's Float8Linear; the rest of the model runs under bf16 autocast.
    PrecisionKind.fp8: torch.bfloat16,
}


class Precision:
    """What `precision=...` means on a device: `autocast()` and whether a GradScaler is needed."""

    def __init__(self, kind: PrecisionKind | str, device_type: str):
        self.kind = PrecisionKind(kind)
        self.device_type = device_type
        self.autocast_dtype = AUTOCAST_DTYPES[self.kind]

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        """fp16 gradients underflow without loss scaling; the scaler also skips steps with inf/nan gradients."""
        if self.kind is not PrecisionKind.fp16:
            return None
        return torch.amp.GradScaler(self.device_type)

    def describe(self) -> str:
        dtype = str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else "off"
        return f"precision={self.kind.value} (autocast {dtype}, grad scaler {'on' if self.kind is PrecisionKind.fp16 else 'off'})"
