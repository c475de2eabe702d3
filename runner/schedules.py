"""The public name recipes and user code write: `_target_: runner.schedules.warmup_cosine` in conf/scheduler/.
The code lives in runner/training/schedules.py; this module forwards every attribute to it, so the name stays put
where the implementation moves (issue 23)."""

from runner.training import schedules as _implementation


def __getattr__(name: str):
    return getattr(_implementation, name)


def __dir__() -> list[str]:
    return dir(_implementation)
