#!/usr/bin/env bash
# Wheels for a GPU machine that has torch (and most of the scientific stack) but no network: the project's own
# dependencies that such images usually lack, for the Python there (default 3.12), into <repo>/.whl (git-ignored).
# tests/gpu/check.sh installs them into a temporary folder when hydra or datasets does not import.
#   bash tests/gpu/fetch_wheels.sh [PYTHON_VERSION]        (here, with pip and a network)
# torchao 0.18 pairs with torch 2.11+ (precision=fp8); pyarrow >= 24 is what datasets 5.2 declares.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${1:-3.12}"
DEST="$ROOT/.whl"
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${platforms[@]}" \
  -d "$DEST" hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 \
  pyarrow==26.0.1 torchao==0.18.0
# antlr4-python3-runtime 4.9.3 (omegaconf's parser) is published as a source archive only: build its pure-Python wheel.
python3 -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
ls -1 "$DEST"
