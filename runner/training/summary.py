"""What a run says about itself in its log: the model, the data and the schedule at the start."""

from __future__ import annotations

from torch import nn


def model_summary(model: nn.Module) -> str:
    """Parameters in total and trainable, then per top-level module (a table, largest first)."""
    def count(module: nn.Module) -> tuple[int, int]:
        parameters = list(module.parameters())
        return (sum(p.numel() for p in parameters), sum(p.numel() for p in parameters if p.requires_grad))

    total, trainable = count(model)
    rows = sorted(((name, *count(child)) for name, child in model.named_children()), key=lambda row: -row[1])
    lines = [f"model {type(model).__name__}: {total:,} parameters ({trainable:,} trainable)"]
    width = max((len(name) for name, _, _ in rows), default=0)
    lines += [f"  {name:<{width}}  {type(model.get_submodule(name)).__name__:<20} {params:>12,}"
              + ("" if train == params else f"  ({train:,} trainable)") for name, params, train in rows]
    return "\n".join(lines)


def data_summary(splits) -> str:
    return "data: " + ", ".join(f"{name} {len(split):,} samples" for name, split in splits.items())


def schedule_summary(steps_per_epoch: int, total_steps: int, max_epochs: int) -> str:
    epochs = total_steps / steps_per_epoch
    return (f"schedule: {steps_per_epoch} optimizer steps per epoch, {total_steps} in total "
            f"({epochs:.3g} of max_epochs={max_epochs} epoch(s))")
