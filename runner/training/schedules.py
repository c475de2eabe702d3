"""Learning-rate schedules that need the run's length, built with `_partial_: true` from the YAML."""

from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> LambdaLR:
    """Linear warm-up over `warmup_steps`, then cosine decay to `min_lr_ratio` x the base LR at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
