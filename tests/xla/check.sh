#!/usr/bin/env bash
# The XLA lane (issue 27, item 1): the runner on a real XLA runtime, torch_xla's CPU device (PJRT_DEVICE=CPU)
# standing in for a TPU. It makes its own venv (torch_xla has no build for the torch the project's venv has; 2.9.0
# of both pair), installs the project and its test extra there, and checks (tests/xla/lane_xla.py):
#   a. `python -m runner hardware=tpu`: the default recipe end to end (train, evaluate, checkpoint, export);
#   b. kill -9 after a checkpoint, then resume=auto: final weights bitwise those of the uninterrupted run;
#   c. runner.Accelerator in a hand-written loop on the XLA device (placement, backward, xm.optimizer_step,
#      gather), per-step losses against the same loop on the CPU;
#   d. precision=bf16 on the XLA device.
# Not here: several processes. torch_xla runs its CPU devices as threads of one process (CPU_NUM_DEVICES), and
# hardware=tpu is one process per device (the runner refuses hardware.num_processes > 1 for it).
#
#   bash tests/xla/check.sh            # from the repo root (CI: after the test suite)
#   bash tests/xla/check.sh c          # only part c (any of a b c d, in the order given)
#
# The last line is the verdict: "XLA lane PASSED", "XLA lane FAILED: ..." (exit 1) or "XLA lane SKIPPED: <why>"
# (exit 0) when the wheels cannot be installed. The venv is $RUNNER_XLA_VENV (default /tmp/runner-xla-venv), kept
# and reused while torch_xla imports in it (the project is installed into it afresh on every run); the runs' outputs
# go to a fresh `mktemp -d`, removed when the lane passed and kept (its path printed) otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
venv="${RUNNER_XLA_VENV:-/tmp/runner-xla-venv}"
versions="torch==2.9.0 torch_xla==2.9.0"
lane_start=$SECONDS
work=""
verdict=""

load() { uptime 2>/dev/null || echo "load average (/proc/loadavg): $(cat /proc/loadavg)"; }
skip() { verdict="SKIPPED: $*"; exit 0; }
fail() { verdict="FAILED: $*"; exit 1; }
finish() {
  local rc=$?
  [[ -z "$verdict" ]] && verdict="FAILED: the lane stopped unexpectedly (exit $rc)" && rc=1
  if [[ -n "$work" ]]; then
    if [[ "$verdict" == PASSED ]]; then rm -rf "$work"; else echo "[xla lane] the runs' outputs are kept in $work"; fi
  fi
  echo "[xla lane] total: $(( SECONDS - lane_start )) s; $(load)"
  echo "XLA lane $verdict"
  exit "$rc"
}
trap finish EXIT

echo "[xla lane] start: $(load)"
# The venv keeps the wheels (torch with its CUDA libraries and torch_xla, 8 GB) between runs, never the project: an
# editable install points at the checkout that made it, which may since be gone or at another commit, and `import
# runner` from the repo root would hide that (the current directory comes first on sys.path). So the project is
# installed on every run, and checked from outside the checkout; with $versions in the same `pip install`, so that
# nothing the project asks for can move torch from under torch_xla (whose wheel does not pin it).
# One lane at a time per venv: two checkouts' lanes would install each its own project into it under the other.
mkdir -p "$(dirname "$venv")" && exec 9>"$venv.lock"
flock -n 9 || { echo "[xla lane] waiting for the lane already using $venv"; flock 9; }
install_log="$(mktemp -t runner-xla-install-XXXX.log)"
if ! "$venv/bin/python" -c "import torch_xla" 2>/dev/null; then
  step=$SECONDS
  echo "[xla lane] installing $versions into $venv (log: $install_log)"
  rm -rf "$venv"
  python3 -m venv "$venv" >"$install_log" 2>&1 || skip "python3 -m venv $venv failed (see $install_log)"
  "$venv/bin/pip" install $versions >>"$install_log" 2>&1 \
    || skip "pip could not install $versions: $(grep -m1 -E 'ERROR' "$install_log" || tail -1 "$install_log")"
  "$venv/bin/python" -c "import torch_xla" >>"$install_log" 2>&1 \
    || skip "torch_xla installed but does not import here: $(tail -1 "$install_log")"
  echo "[xla lane] install $versions: $(( SECONDS - step )) s"
fi
step=$SECONDS
"$venv/bin/pip" install -e ".[test]" $versions >>"$install_log" 2>&1 \
  || fail "the project does not install beside $versions: $(grep -m1 ERROR "$install_log" || tail -1 "$install_log")"
installed="$(cd / && "$venv/bin/python" -c 'import runner; print(runner.__file__)' 2>&1)"
[[ "$installed" == "$PWD/runner/__init__.py" ]] \
  || fail "after \`pip install -e .\` the venv's runner is '$installed', not this checkout's $PWD/runner/__init__.py"
rm -f "$install_log"
echo "[xla lane] install the project (.[test], editable): $(( SECONDS - step )) s"
export PJRT_DEVICE=CPU
echo "[xla lane] $("$venv/bin/python" -c 'import torch, torch_xla; print("torch", torch.__version__, "torch_xla", torch_xla.__version__)')"

work="$(mktemp -d -t runner-xla-lane-XXXX)"
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(a b c d)
for part in "${parts[@]}"; do
  step=$SECONDS
  "$venv/bin/python" tests/xla/lane_xla.py "$part" --work "$work/$part" 2>"$work/$part.err" \
    || { tail -5 "$work/$part.err"; fail "part $part: $(grep -m1 'FAILED' "$work/$part.err" || tail -1 "$work/$part.err")"; }
  echo "[xla lane] part $part: $(( SECONDS - step )) s"
done
verdict=PASSED
