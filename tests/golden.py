"""Golden losses, one data file per recipe (tests/assets/losses/<recipe>.txt): which recipes, with which overrides,
the file's format, and the recorder that writes it. tests/run/test_golden.py trains each recipe and compares its losses
with the file; after a deliberate change of the numbers, re-record and review the diff:

    python tests/golden.py --record                   # every recipe
    python tests/golden.py --record gpt reverse       # some

The file, plain text so that a changed loss is a one-line diff:

    # comment lines: the recipe, how to re-record it, what recorded it (packages, Python, machine, threads)
    overrides: recipe=reverse data.num_train=640 ...
    train/loss 10 2.44237
    val/loss 20 2.27969

`overrides:` is what the run was given: the test checks it against GOLDEN below, so an override changed without a
re-record fails saying so instead of as a loss that moved. Then one `<tag> <step> <value>` line per logged point,
the value to 6 significant digits (the test's tolerance is far coarser).

Every run starts in a folder holding the small files tests/matrix_data.py writes (corpus.txt, table.csv, texts.csv,
images/), so the overrides name them relative to the working directory and nothing comes from the internet.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import matrix_data
from conftest import ROOT, read_scalars, run_cli

LOSSES = Path(__file__).with_name("assets") / "losses"
TAGS = ("train/loss", "val/loss")
RECORDER_THREADS = 1  # recorded on one thread, as the suite's subprocesses run (tests/conftest.py)
# The packages whose versions can move a loss: torch's kernels and initialisation, the data and tokenizer libraries.
PACKAGES = ("torch", "numpy", "datasets", "tokenizers", "scikit-learn", "pillow", "transformers")


def _short(steps: int) -> tuple[str, ...]:
    """A run of `steps` optimizer steps that logs every 10 and evaluates once, at the end: seconds on a CPU."""
    return (f"trainer.max_steps={steps}", "trainer.log_every_steps=10", f"trainer.eval_every_steps={steps}",
            "trainer.progress_bar=false")


# Every recipe in recipes/, at its own model size, for a few dozen steps on matrix_data.py's files. Each trains in
# seconds on a CPU and needs nothing from the internet (gpt2_hf builds its transformers model from a config: no
# download, only the optional `transformers` package, without which its test is skipped). tests/run/test_golden.py
# checks that every recipe in recipes/ is here, so a new recipe gets a golden file (or a written reason why not).
GOLDEN: dict[str, tuple[str, ...]] = {
    # The first golden run (torch 2.13, CPU), kept as it was so the numbers' history is continuous: 640 generated
    # rows, evaluated half-way as well as at the end.
    "reverse": ("data.num_train=640", "data.num_validation=64", "trainer.batch_size=32", "trainer.max_steps=40",
                "trainer.log_every_steps=10", "trainer.eval_every_steps=20", "trainer.progress_bar=false"),
    "digits_mlp": _short(30),
    "digits_cnn": _short(30),
    "gpt": ("data.train=corpus.txt", *_short(30)),
    "gpt2_hf": ("data.train=corpus.txt", *_short(30)),
    "tabular_csv": ("data.train=table.csv", *_short(30)),
    # 64 training texts are 2 steps an epoch: more epochs than the recipe's 7, so that max_steps ends the run.
    "text_classification": ("data.train=texts.csv", "trainer.max_epochs=100", *_short(30)),
    # 10 training images are one step an epoch: the recipe's 30 epochs are these 30 steps. Two classes of flat
    # colour: at the recipe's learning rate the loss is below 1e-2 by step 10 and ~3e-4 at the end, a difference of
    # two nearly equal numbers that rounding on another CPU moves by a large relative amount; at 1e-4 it stays
    # between 0.05 and 0.4.
    "image_folder": ("data.train=images", "optimizer.lr=1e-4", *_short(30)),
}


def overrides(recipe: str) -> tuple[str, ...]:
    return (f"recipe={recipe}", *GOLDEN[recipe])


def path(recipe: str) -> Path:
    return LOSSES / f"{recipe}.txt"


def record_command(recipe: str) -> str:
    return f"python tests/golden.py --record {recipe}"


@dataclass
class Golden:
    overrides: tuple[str, ...]
    losses: dict[str, list[tuple[int, float]]]  # tag -> (step, value), in step order


def read(recipe: str) -> Golden:
    found_overrides: tuple[str, ...] = ()
    losses: dict[str, list[tuple[int, float]]] = {}
    for number, line in enumerate(path(recipe).read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("overrides:"):
            found_overrides = tuple(line.removeprefix("overrides:").split())
            continue
        try:
            tag, step, value = line.split()
            losses.setdefault(tag, []).append((int(step), float(value)))
        except ValueError:
            raise ValueError(f"{path(recipe)}:{number}: expected '<tag> <step> <value>', found {line!r}") from None
    return Golden(found_overrides, losses)


def losses_of(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What a finished run logged to TensorBoard, per tag in TAGS."""
    return {tag: read_scalars(run_dir, tag) for tag in TAGS}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux: platform.processor() is often empty there, the model name is here
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]
        cpu = models[0] if models else cpu
    return f"{platform.system()} {platform.machine()}, {cpu}"


def _versions() -> str:
    found = []
    for package in PACKAGES:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def render(recipe: str, losses: dict[str, list[tuple[int, float]]]) -> str:
    lines = [f"# Golden losses of recipe={recipe}: tests/run/test_golden.py trains it with these overrides and compares.",
             "# Run in a folder holding tests/matrix_data.py's files. After a deliberate change of the numbers,",
             f"# re-record and review the diff: {record_command(recipe)}",
             f"# Recorded by `python -m runner`, {RECORDER_THREADS} thread, with {_versions()}, "
             f"Python {platform.python_version()}, on {_machine()}.",
             "overrides: " + " ".join(overrides(recipe))]
    lines += [f"{tag} {step} {value:.6g}" for tag in TAGS for step, value in losses[tag]]
    return "\n".join(lines) + "\n"


def record(recipe: str) -> None:
    """Train the recipe as a user would (`python -m runner`, offline) and rewrite its file."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        matrix_data.write(folder)
        # A cache and a config home of its own: nothing from ~/.cache or this machine's defaults moves the numbers.
        env = {"OMP_NUM_THREADS": str(RECORDER_THREADS), "HF_DATASETS_CACHE": str(folder / "hf_cache"),
               "RUNNER_CONFIG_HOME": str(folder / "config_home"), "HF_HUB_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        result = run_cli(*overrides(recipe), cwd=folder, env=env)
        if result.returncode != 0:
            raise SystemExit(f"recipe={recipe} failed (exit {result.returncode}); nothing recorded:\n"
                             f"{result.output[-4000:]}")
        losses = losses_of(result.run_dir())
    LOSSES.mkdir(parents=True, exist_ok=True)
    path(recipe).write_text(render(recipe, losses))
    print(f"recorded {path(recipe).relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", required=True,
                        help="train the recipes and rewrite their golden files")
    parser.add_argument("recipes", nargs="*", metavar="RECIPE", help=f"default: all of {', '.join(GOLDEN)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.recipes if name not in GOLDEN]
    if unknown:
        parser.error(f"no golden run for {', '.join(unknown)}; the recipes are {', '.join(GOLDEN)}")
    for recipe in args.recipes or GOLDEN:
        record(recipe)


if __name__ == "__main__":
    main()
