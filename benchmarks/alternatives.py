"""What a user would pick instead of the runner, as benchmark arms: HuggingFace Accelerate and Lightning Fabric.

Each drives the benchmarks' own plain loop the way its README writes one: set the model and optimizer up, call its
backward, save and load through it. Both are optional (the `bench` extra): an arm whose package is
missing is skipped, and the report says so instead of printing a figure.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from runner.ground import install_hint

# Arm name -> the module it needs. The plain loop and the runner are always measured.
FRAMEWORKS = {"accelerate": "accelerate", "fabric": "lightning_fabric"}
LABELS = {"plain": "plain PyTorch", "runner": "runner", "accelerate": "HuggingFace Accelerate",
          "fabric": "Lightning Fabric"}
ARMS = ("plain", "runner", *FRAMEWORKS)


def installed(arm: str) -> bool:
    return arm not in FRAMEWORKS or importlib.util.find_spec(FRAMEWORKS[arm]) is not None


def available(arms=ARMS) -> tuple[str, ...]:
    return tuple(arm for arm in arms if installed(arm))


def interleaved(arms, index: int) -> list:
    """The order of the arms in round `index`: rotated one place a round (A B C D, B C D A, C D A B, ...), so each arm
    takes each place equally often and none runs twice in a row across a round's end. (Reversing every other round
    would run the first and the last arm back to back, their caches still warm: a 4-arm MLP run read the plain loop
    7% faster than every other arm that way.) With two arms this is A B, B A: each arm runs twice in a row once."""
    arms = list(arms)
    shift = index % len(arms)
    return arms[shift:] + arms[:shift]


def missing_note(arm: str) -> str:
    return f"{LABELS[arm]}: not measured ({FRAMEWORKS[arm]} is not installed: {install_hint('bench')})"


@dataclass
class Framework:
    """One framework set up for a loop: the calls a hand-written loop makes on it."""

    setup: Callable  # (model, optimizer) -> (model, optimizer), wrapped
    backward: Callable  # (loss) -> None
    save: Callable  # (directory, model, optimizer) -> None, with the wrapped objects
    load: Callable  # (directory, model, optimizer) -> None, into wrapped objects of the same shapes


def framework(arm: str, processes: int = 1) -> Framework:
    """`arm` set up on the CPU for `processes` processes (under torchrun when more than one)."""
    if arm == "accelerate":
        from accelerate import Accelerator

        # Made now, as a script makes it first: under torchrun it joins the process group. A fresh one for each
        # further setup, since save_state()/load_state() act on every model an Accelerator has prepared.
        current = {"accelerator": Accelerator(cpu=True)}

        def setup(model, optimizer):
            if current["accelerator"]._models:
                current["accelerator"] = Accelerator(cpu=True)
            return current["accelerator"].prepare(model, optimizer)

        return Framework(setup=setup, backward=lambda loss: current["accelerator"].backward(loss),
                         save=lambda directory, model, optimizer: current["accelerator"].save_state(str(directory)),
                         load=lambda directory, model, optimizer: current["accelerator"].load_state(str(directory)))
    if arm == "fabric":
        from lightning_fabric import Fabric

        fabric = Fabric(accelerator="cpu", devices=processes, strategy="ddp" if processes > 1 else "auto",
                        precision="32-true")
        fabric.launch()  # under torchrun: joins the process group torchrun's environment describes

        def save(directory: Path, model, optimizer) -> None:
            fabric.save(Path(directory) / "state.ckpt", {"model": model, "optimizer": optimizer})

        def load(directory: Path, model, optimizer) -> None:
            fabric.load(Path(directory) / "state.ckpt", {"model": model, "optimizer": optimizer})

        return Framework(setup=fabric.setup, backward=fabric.backward, save=save, load=load)
    raise ValueError(f"no framework arm {arm!r}; choose from {', '.join(FRAMEWORKS)}")
