"""The FLOPs a training step costs and the share of the device's peak a run achieves (MFU).

The FLOPs of one sample are counted once, before training, by torch.utils.flop_counter over the task's loss and
its backward on the meta device: the model's parameters are swapped for meta tensors of the same shapes, so the
count costs no arithmetic, touches no weight, gradient or random state, and sees the plain model (no activation
checkpointing's recompute, no compiled graph: the FLOPs the model needs, not those a wrapper adds). The counter
counts matrix products and attention (what dominates a step); for a transformer it agrees with 6N per token plus
attention to within a few tenths of a percent (tests/training/test_throughput.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from runner.distributed.peak import Peak, default_cache_dir
from runner.errors import first_line

log = logging.getLogger(__name__)


class _OnMeta:
    """Calls the model with meta tensors in place of its parameters and buffers (torch.func.functional_call)."""

    def __init__(self, model: nn.Module, state: dict[str, torch.Tensor]):
        self.model, self.state = model, state

    def __call__(self, *args, **kwargs):
        return torch.func.functional_call(self.model, self.state, args, kwargs)

    def __getattr__(self, name):  # a task reading the model's attributes (a config, a block size) gets the model's
        return getattr(self.model, name)


def count_flops_per_sample(model: nn.Module, task, batch: dict[str, torch.Tensor]) -> tuple[float | None, str]:
    """FLOPs of the forward and backward of one sample of `batch` under `task`'s training loss, and how they were
    found (or why not, with None)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        parameters = {name: torch.empty_like(value, device="meta").requires_grad_(value.requires_grad)
                      for name, value in model.named_parameters()}
        buffers = {name: torch.empty_like(value, device="meta") for name, value in model.named_buffers()}
        meta_batch = {key: value.to("meta") if isinstance(value, torch.Tensor) else value
                      for key, value in batch.items()}
        rows = next(value.shape[0] for value in batch.values() if isinstance(value, torch.Tensor))
        trainable = [value for value in parameters.values() if value.requires_grad]
        # In eval mode, like the check_fit forward before it: a model that counts its training forwards (or
        # updates state only in training) sees no extra one; dropout, the one difference, multiplies no matrix.
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
                loss = task.training_loss(_OnMeta(model, {**parameters, **buffers}), meta_batch)
                torch.autograd.grad(loss, trainable, allow_unused=True)
        finally:
            model.train(was_training)
    except Exception as err:  # noqa: BLE001 - any model may fail on meta tensors; MFU is then not logged
        return None, f"not counted: the model's step failed on the meta device ({first_line(err)})"
    flops = counter.get_total_flops()
    if not flops:
        return None, "not counted: the step has no matrix product torch.utils.flop_counter knows"
    return flops / rows, "counted on one step's forward and backward by torch.utils.flop_counter"


@dataclass
class Throughput:
    """What the loop needs to turn samples/s into FLOP/s per device and MFU."""

    flops_per_sample: float | None
    peak: Peak
    counted: str = ""
    above_peak_said: bool = field(default=False, repr=False, compare=False)

    def metrics(self, samples_per_s: float, processes: int) -> dict[str, float]:
        if not self.flops_per_sample:
            return {}
        flops_per_s = samples_per_s * self.flops_per_sample / processes
        metrics = {"train/flops_per_s": flops_per_s}
        if self.peak.flops_per_s:
            metrics["train/mfu"] = flops_per_s / self.peak.flops_per_s
            if metrics["train/mfu"] > 1 and not self.above_peak_said:
                # No run computes faster than its device's peak: the peak is wrong (a CPU's, measured while other
                # work held the cores, then cached), and every train/mfu of the run with it.
                self.above_peak_said = True
                log.warning("train/mfu is %.2f, above 1: the peak it is measured against (%s) is too low; on a "
                            "CPU, delete %s to measure it again on idle cores", metrics["train/mfu"],
                            self.peak.source, default_cache_dir() / "peak_flops.json")
        return metrics

    def describe(self, tokens_per_sample: int | None = None) -> str:
        if not self.flops_per_sample:
            return f"throughput: FLOP/s and MFU not logged: FLOPs {self.counted}"
        per = (f"{human_flops(self.flops_per_sample / tokens_per_sample)} per token" if tokens_per_sample
               else f"{human_flops(self.flops_per_sample)} per sample")
        peak = (f"train/mfu against a peak of {human_flops(self.peak.flops_per_s)}/s per device ({self.peak.source})"
                if self.peak.flops_per_s else f"no train/mfu: {self.peak.source}")
        return f"throughput: {per} ({self.counted}); train/flops_per_s per device, {peak}"


def human_flops(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"
