"""The public name recipes and user code write: `_target_: runner.hf_tasks.CausalLM` in conf/task/.
The code lives in runner/training/hf_tasks.py; this module forwards every attribute to it, so the name stays put
where the implementation moves (issue 23)."""

from runner.training import hf_tasks as _implementation


def __getattr__(name: str):
    return getattr(_implementation, name)


def __dir__() -> list[str]:
    return dir(_implementation)
