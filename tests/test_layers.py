"""The layering rule (docs/architecture.md, "Layers"): a module imports only from its own layer and the layers
below. Every import in runner/ counts, function-level ones included, and every module has a layer; the package's
own `__init__` loads its public names by string (PEP 562), checked against the table separately."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import runner

PACKAGE = Path(runner.__file__).resolve().parent
UNLAYERED = 99

# module (or package) -> layer; the longest matching prefix wins
LAYERS = {
    "runner.errors": 0,
    "runner.hub": 0,
    "runner.ground": 0,
    "runner.config": 1,
    "runner.distributed": 2,
    "runner.checkpoint": 3,
    "runner.accelerate": 4,
    "runner.data": 5,
    "runner.models": 5,
    "runner.training": 6,
    "runner.run": 7,
    "runner.launch": 8,
    "runner.sweep": 8,
    "runner.commands": 9,
    "runner.__main__": 9,
    # the names recipes write, forwarding to runner/training/ (`_target_: runner.callbacks.EarlyStopping`)
    "runner.callbacks": 6,
    "runner.loggers": 6,
    "runner.tasks": 6,
    "runner.hf_tasks": 6,
    "runner.schedules": 6,
}


def layer(module: str) -> int:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return UNLAYERED


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    path = PACKAGE.parent / relative
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, runner module) for every import of a runner module in the file, at any depth."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "runner"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "runner":
                continue
            for alias in node.names:  # `from runner.distributed import dist` imports a module, `from runner import X` a name
                target = f"{source}.{alias.name}"
                found.append((node.lineno, target if _is_module(target) else source))
    return found


def _files() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "conf" not in path.relative_to(PACKAGE).parts)


def test_no_upward_imports():
    wrong = []
    for path in _files():
        name = _module_name(path)
        for line, target in imports(path):
            if layer(target) > layer(name):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} (layer {layer(name)}) imports "
                             f"{target} (layer {layer(target)})")
    assert not wrong, "imports from a higher layer:\n" + "\n".join(wrong)


def test_every_module_has_a_layer():
    unplaced = [str(path.relative_to(PACKAGE.parent)) for path in _files()
                if _module_name(path) != "runner" and layer(_module_name(path)) == UNLAYERED]
    assert not unplaced, f"modules with no layer in tests/test_layers.py's LAYERS: {unplaced}"


def test_public_names_are_at_or_below_accelerate():
    """`runner.Accelerator` and the other names `runner/__init__.py` loads on first use."""
    placed = {name: (module, layer(module)) for name, module in runner._PUBLIC.items()}
    assert all(level <= LAYERS["runner.accelerate"] for _, level in placed.values()), placed


def _calls(path: Path, module: str, function: str) -> list[int]:
    """Lines of every `module.function(...)` call in the file."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == function
            and isinstance(node.func.value, ast.Name) and node.func.value.id == module]


def test_signal_handlers_are_installed_in_one_module():
    home = PACKAGE / "distributed" / "signals.py"
    elsewhere = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in _files() if path != home
                 for line in _calls(path, "signal", "signal")]
    assert not elsewhere, f"signal.signal outside runner/distributed/signals.py: {elsewhere}"


def test_errors_reach_the_console_through_one_function():
    """`runner: error: ...` is written by runner.errors.print_error (and exit_with) only."""
    home = PACKAGE / "errors.py"
    elsewhere = [f"{path.relative_to(PACKAGE.parent)}:{number}" for path in _files() if path != home
                 for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "error: {" in text and "print(" in text]
    assert not elsewhere, f"errors printed outside runner/errors.py: {elsewhere}"


def test_no_cycles_among_layered_modules():
    graph = {}
    for path in _files():
        name = _module_name(path)
        if layer(name) != UNLAYERED:
            graph[name] = {target for _, target in imports(path) if layer(target) != UNLAYERED and target != name}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_public_names_need_no_hydra_nor_the_loop():
    """What a hand-written loop on the Accelerator imports: no Hydra, no loop, no launcher."""
    code = ("import sys, runner\n"
            "from runner import Accelerator, RunConfig, RunnerError\n"
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    forbidden = ("hydra", "runner.training", "runner.run", "runner.launch", "runner.sweep", "runner.commands")
    pulled = [name for name in loaded if any(name == word or name.startswith(word + ".") for word in forbidden)]
    assert not pulled, f"`from runner import Accelerator` imports {pulled}"
