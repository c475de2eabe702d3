"""Write scikit-learn's bundled iris and wine tables (no download) as CSV files with a header, like a user's own
table, for `recipe=tabular_csv`:

    python benchmarks/tables.py tables
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
            writer.writerow([column.replace(" (cm)", "").replace(" ", "_").replace("/", "_") for column in bunch.feature_names] + [label])
            for row, target in zip(bunch.data, bunch.target):
                writer.writerow([f"{value:g}" for value in row] + [bunch.target_names[target] if names else int(target)])
        written[name] = len(bunch.data)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the folder to write iris.csv and wine.csv into")
    args = parser.parse_args()
    for name, rows in write_tables(args.output).items():
        print(f"{args.output / (name + '.csv')}: {rows} rows")


if __name__ == "__main__":
    main()
