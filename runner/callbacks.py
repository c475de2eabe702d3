"""The public name recipes and user code write: `_target_: runner.callbacks.EarlyStopping` in conf/callbacks/, `class MyCallback(runner.callbacks.Callback)` in
user code.
The code lives in runner/training/callbacks.py; this module forwards every attribute to it, so the name stays put
where the implementation moves (issue 23)."""

from runner.training import callbacks as _implementation


def __getattr__(name: str):
    return getattr(_implementation, name)


def __dir__() -> list[str]:
    return dir(_implementation)
