"""Recipe commands: what recipes there are, what one composes to, a copy to edit, and a check without training.

    runner recipes list                           # built-in and your own (./recipes, $RUNNER_RECIPE_PATH)
    runner recipes show gpt data.train=x.txt      # the whole composed config, as the run would use it
    runner recipes copy digits_mlp [my_digits]    # into ./recipes/, to edit (yours then wins over the built-in)
    runner recipes validate gpt data.train=x.txt  # compose, check, build every target and the data, no training

(`python -m runner recipes ...` is the same.) validate builds the model on the meta device and one batch's shapes
through it (runner/run/validate.py), so a broken `_target_` or a model that does not fit the data fails here with the
same message as a real run.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from runner.config.search_path import builtin_recipes, user_recipe_dirs


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    builtin: bool

    @property
    def description(self) -> str:
        """The recipe's first comment line after its package header: what the experiment is."""
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.startswith("#") and "@package" not in line:
                return line.lstrip("# ").strip()
        return ""


def available() -> dict[str, Recipe]:
    """Every recipe by name: the user's folders first (they win on a name clash), then the built-in ones."""
    found: dict[str, Recipe] = {}
    for folder, builtin in [*((folder, False) for folder in user_recipe_dirs()), (builtin_recipes(), True)]:
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, Recipe(path.stem, path, builtin))
    return found


def listing() -> str:
    recipes = available()
    width = max(map(len, recipes), default=0)
    lines = [f"{name:<{width}}  {'built-in' if recipe.builtin else str(recipe.path.parent)}: {recipe.description}"
             for name, recipe in sorted(recipes.items())]
    if all(recipe.builtin for recipe in recipes.values()):
        from runner.config.search_path import RECIPE_PATH_VARIABLE

        lines.append(f"(none of your own yet: a recipe of yours goes in {Path('recipes').resolve()}, or in a folder "
                     f"on ${RECIPE_PATH_VARIABLE}; start from a copy: runner recipes copy digits_mlp my_digits)")
    return "\n".join(lines)


def _named(name: str) -> Recipe:
    from runner.errors import ConfigError

    recipes = available()
    if name not in recipes:
        raise ConfigError("recipe", f"'{name}' is not a recipe; the recipes are {', '.join(sorted(recipes))}")
    return recipes[name]


def show(name: str, overrides: list[str]) -> str:
    """The recipe's whole config, resolved for this machine. A recipe that leaves required values to set (`???`,
    e.g. a copied tabular_csv's data.train) is shown as composed, with those keys named at the end: what is
    left to fill in is what the user came to see."""
    import yaml
    from omegaconf import OmegaConf

    from runner.run.compose import compose_config, resolve
    from runner.config import plain

    _named(name)
    cfg = compose_config([f"recipe={name}", *overrides])
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        return (OmegaConf.to_yaml(cfg) + f"# still to set (???): {', '.join(missing)}; e.g. runner recipe={name} "
                f"{missing[0]}=...")
    return yaml.safe_dump(plain(resolve(cfg).config), sort_keys=False)


def copy(name: str, target: str | None = None) -> Path:
    from runner.errors import ConfigError

    recipe = _named(name)
    new_name = target or name
    if not re.fullmatch(r"[A-Za-z0-9_-]+", new_name):  # a recipe is named by its file's stem in recipes/: recipe=<name>
        raise ConfigError("recipe", f"'{new_name}' cannot name a recipe in recipes/: use letters, digits, _ and -, "
                                    f"e.g. runner recipes copy {name} my_{name}")
    destination = Path("recipes") / f"{new_name}.yaml"
    if destination.exists():
        raise ConfigError("recipe", f"{destination} exists already; give another name: runner recipes copy {name} NEW")
    destination.parent.mkdir(exist_ok=True)
    # The header names the new recipe, so the file says what it is wherever it is opened.
    lines = recipe.path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = 1 if lines and "@package" in lines[0] else 0
    origin = "built-in recipe" if recipe.builtin else f"recipe in {recipe.path.parent}"
    lines.insert(at, f"# Recipe {destination.stem}, copied from the {origin} {name}; run it: runner "
                     f"recipe={destination.stem}\n")
    destination.write_text("".join(lines), encoding="utf-8")
    return destination


def validate(name: str, overrides: list[str]) -> str:
    from runner.run.compose import load
    from runner.run.validate import validate as check_without_training

    _named(name)
    spec = load([f"recipe={name}", *overrides])
    validated = check_without_training(spec.config, spec.hardware)
    return (f"recipe {name}: valid. {validated.parameters:,} parameters, {validated.batch.describe()}, "
            f"{validated.total_steps} optimizer steps on {spec.hardware.world_size} process(es) "
            f"({spec.hardware.device_type})")


USAGE = "usage: runner recipes [list | show NAME [overrides] | copy NAME [NEW_NAME] | validate NAME [overrides]]"


def main(argv: list[str] | None = None) -> None:
    from runner.errors import RunnerError, exit_with

    arguments = sys.argv[1:] if argv is None else argv
    command, rest = (arguments[0], arguments[1:]) if arguments else ("list", [])
    try:
        if command == "list":
            print(listing())
        elif command in ("show", "validate") and rest:
            print((show if command == "show" else validate)(rest[0], rest[1:]))
        elif command == "copy" and 1 <= len(rest) <= 2:
            destination = copy(*rest)
            print(f"copied to {destination}; edit it, then run it: runner recipe={destination.stem}")
        else:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
    except RunnerError as err:
        exit_with(err)


if __name__ == "__main__":
    main()
