"""How a runner process ends: quickly, once its work is written.

At exit Python runs its cyclic garbage collector over every object the process still holds. After a run that is
everything torch, torch._dynamo (imported by the first optimizer), datasets and Hydra built at import, about a
million objects: 1.1-1.3 s between a run's last write and its exit on a 2-core machine, paid by every run and, in
a multi-process run, by every worker before the launcher can return.
"""

from __future__ import annotations

import atexit
import gc


def skip_collection_at_exit() -> None:
    """Freeze the heap when the process exits, so the collector's exit passes skip it (measured 1.3 s -> 0.2 s).

    Only the cyclic collection at exit is skipped: every exit handler still runs (logging's flush, TensorBoard's and
    W&B's), and objects are still freed by reference counting. What is lost is a __del__ on an object caught in a
    reference cycle, which Python never promises to run at exit anyway; the runner closes its files, loggers and
    checkpoint writers explicitly before it returns. Process-wide: the CLI, `runner.launch` and each worker call
    it once at start; calling it again is harmless."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
