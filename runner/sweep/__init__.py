"""Layer 8, sweep: what Hydra's sweeps leave behind. `callback` (the Hydra callback conf/config.yaml registers as
`runner.sweep.SweepReport`: the refusals before a sweep starts, result.json per job, the report at the end) and
`report` (result.json, sweep_report.csv/.md and the HParams view; plain Python, no Hydra).

`runner.sweep.SweepReport` is the name a config writes; it loads the callback (and Hydra) on first use only, so
importing `runner.sweep.report` does not."""

from __future__ import annotations

import importlib

_CALLBACK_NAMES = ("SweepReport", "SweepJobFailed")


def __getattr__(name: str):
    if name in _CALLBACK_NAMES:
        return getattr(importlib.import_module("runner.sweep.callback"), name)
    raise AttributeError(f"module 'runner.sweep' has no attribute {name!r}")
