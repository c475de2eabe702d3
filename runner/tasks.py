"""The public name recipes and user code write: `_target_: runner.tasks.Classification` in conf/task/ and recipes.
The code lives in runner/training/tasks.py; this module forwards every attribute to it, so the name stays put
where the implementation moves (issue 23)."""

from runner.training import tasks as _implementation


def __getattr__(name: str):
    return getattr(_implementation, name)


def __dir__() -> list[str]:
    return dir(_implementation)
