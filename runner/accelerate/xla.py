"""TPU through torch_xla: the device, the optimizer step and sync, and a device loader. Imported only for hardware=tpu.

torch_xla is imported lazily and for real (a wheel can install fine yet fail to load against another torch build:
no torch_xla build exists for torch 2.13, and the 2.9 wheel fails with an undefined symbol).
"""

from __future__ import annotations

import importlib

import torch

from runner.distributed.devices import INSTALL_HINT, xla_problem
from runner.accelerate.prepared import DeviceBatches

class Xla:
    """The handful of torch_xla calls a run needs, behind one small object (so tests can check them with a stand-in)."""

    def __init__(self):
        try:
            self.torch_xla = importlib.import_module("torch_xla")
            self.xm = importlib.import_module("torch_xla.core.xla_model")
            self.parallel_loader = importlib.import_module("torch_xla.distributed.parallel_loader")
        except ImportError as err:
            from runner.errors import HardwareError

            raise HardwareError(xla_problem() or f"tpu: torch_xla failed to import ({err}); {INSTALL_HINT}") from err

    def device(self) -> torch.device:
        return self.torch_xla.device()

    def optimizer_step(self, optimizer) -> None:
        """All-reduce gradients across replicas, step, then cut the lazy graph so it runs now."""
        self.xm.optimizer_step(optimizer)
        self.sync()

    def sync(self) -> None:
        self.torch_xla.sync()

    def loader(self, batches, device: torch.device) -> "XlaBatches":
        """Batches moved to the XLA device by background threads, overlapping transfer and compute."""
        return XlaBatches(batches, self.parallel_loader.MpDeviceLoader(batches, device), device)


class XlaBatches(DeviceBatches):
    """torch_xla's device loader, keeping the batch source's `len` and `set_epoch` that the loop relies on."""

    def __init__(self, batches, device_loader, device: torch.device):
        super().__init__(batches, device)
        self.device_loader = device_loader

    def __iter__(self):
        return iter(self.device_loader)
