"""The public name recipes and user code write: `_target_: runner.loggers.TensorBoard` in conf/logger/, and a user's own sink's base classes.
The code lives in runner/training/loggers.py; this module forwards every attribute to it, so the name stays put
where the implementation moves (issue 23)."""

from runner.training import loggers as _implementation


def __getattr__(name: str):
    return getattr(_implementation, name)


def __dir__() -> list[str]:
    return dir(_implementation)
