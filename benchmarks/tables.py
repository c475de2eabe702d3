"""Write scikit-learn's bundled iris and wine tables (no download) as CSV files with a header, like a user's own
table, for `recipe=tabular_csv`:

    python benchmarks/tables.py tables
    python benchmarks/tables.py tables --baselines   # scikit-learn on the runner's own hold-out, for comparison
    python -m runner recipe=tabular_csv data.train=tables/wine.csv data.label_column=cultivar
    python -m runner recipe=tabular_csv data.train=tables/iris.csv data.label_column=species

Iris: 150 rows, 4 measurements in cm, 3 species (names). Wine: 178 rows, 13 chemical measurements on scales from
0.1 to 1,680, 3 cultivars (numbered 0-2): the table the recipe's standardisation is for. Needs scikit-learn
(`pip install -e '.[digits]'`).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def write_tables(root: Path) -> dict[str, int]:
    from sklearn.datasets import load_iris, load_wine

    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, loader, label, names in (("iris", load_iris, "species", True), ("wine", load_wine, "cultivar", False)):
        bunch = loader()
        with open(root / f"{name}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            columns = [name.replace(" (cm)", "").replace(" ", "_").replace("/", "_") for name in bunch.feature_names]
            writer.writerow(columns + [label])
            for row, target in zip(bunch.data, bunch.target):
                writer.writerow([f"{value:g}" for value in row] + [bunch.target_names[target] if names else int(target)])
        written[name] = len(bunch.data)
    return written


LABELS = {"iris": "species", "wine": "cultivar"}


def baselines(root: Path) -> None:
    """Standardised logistic regression and 5-nearest-neighbours on exactly the split the recipe trains and
    validates on (runner.data.local_files with its defaults: 20% held out, seed 0)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler

    from runner.data import local_files

    for name, label in LABELS.items():
        splits = local_files(str(root / f"{name}.csv"), label_column=label)
        train, validation = (splits[split].with_format("numpy")[:] for split in ("train", "validation"))
        scaler = StandardScaler().fit(train["features"])
        for model in (LogisticRegression(max_iter=2000), KNeighborsClassifier(5)):
            model.fit(scaler.transform(train["features"]), train["label"])
            right = int((model.predict(scaler.transform(validation["features"])) == validation["label"]).sum())
            print(f"{name}: {type(model).__name__} {right}/{len(validation['label'])} = "
                  f"{right / len(validation['label']):.3f} validation accuracy")


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("output", type=Path, help="the folder to write iris.csv and wine.csv into")
    parser.add_argument("--baselines", action="store_true", help="also score scikit-learn on the recipe's hold-out")
    args = parser.parse_args()
    for name, rows in write_tables(args.output).items():
        print(f"{args.output / (name + '.csv')}: {rows} rows")
    if args.baselines:
        baselines(args.output)


if __name__ == "__main__":
    main()
