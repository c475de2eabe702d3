"""Layer 2, distributed: rank and environment reading, the process group and its collectives (`dist`), devices
and hardware (`devices`), stop signals (`signals`).

No face imports here on purpose: `python -m runner` installs its stop-signal handler from `signals` before torch
is imported, and importing this package must not load torch (`dist` and `devices` do)."""
