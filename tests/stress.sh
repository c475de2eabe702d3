#!/usr/bin/env bash
# Run the README's test command N times in a row (default 3) while one CPU burner per core keeps every core busy:
# the check that the suite does not depend on how fast the machine is (issue 29). Prints each run's pytest summary
# line, its duration and the load average, and keeps the whole output of a failed run (its path is printed); exits
# non-zero if any run failed. Extra arguments go to pytest.
#
#   bash tests/stress.sh 3
#   bash tests/stress.sh 1 tests/accelerate/test_parallel.py    # one file, for a quick look
set -u

runs="${1:-3}"
shift || true
case "$runs" in
    ''|*[!0-9]*) echo "usage: bash tests/stress.sh [RUNS] [PYTEST ARGS...]  (RUNS: a whole number, got '$runs')" >&2
                 exit 2 ;;
esac

cd "$(dirname "$0")/.."
burners=()
stop_burners() {
    if [ "${#burners[@]}" -gt 0 ]; then
        kill "${burners[@]}" 2>/dev/null
        wait "${burners[@]}" 2>/dev/null
    fi
    burners=()
}
trap stop_burners EXIT
trap 'exit 130' INT TERM

cores="$(nproc)"
for _ in $(seq "$cores"); do
    python3 -c 'while True: pass' &
    burners+=("$!")
done
echo "stress: ${#burners[@]} CPU burner(s) on $cores core(s); $runs run(s) of: python -m pytest $*"

failed=0
log="$(mktemp -t stress-pytest.XXXXXX)"
for run in $(seq "$runs"); do
    started=$(date +%s)
    python -m pytest "$@" >"$log" 2>&1
    status=$?
    seconds=$(( $(date +%s) - started ))
    # "== 1 failed, 500 passed in 1710.2s ==" (or without the rulers under -q)
    summary="$(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -n 1 | sed -E 's/^[= ]+|[= ]+$//g')"
    echo "run $run/$runs: exit $status, ${seconds} s ($(( seconds / 60 )) min $(( seconds % 60 )) s), load average" \
         "$(cut -d' ' -f1-3 /proc/loadavg): ${summary:-no pytest summary line}"
    if [ "$status" -ne 0 ]; then
        failed=1
        grep -E '^(FAILED|ERROR) ' "$log" || tail -n 20 "$log"
        # A failure that only load brings out may not come back: keep the whole log to read the cause from.
        kept="$(mktemp -t "stress-run$run-failed.XXXXXX.log")"
        cp "$log" "$kept"
        echo "run $run's full pytest output: $kept"
    fi
done
rm -f "$log"
if [ "$failed" -ne 0 ]; then
    echo "stress: at least one run failed" >&2
fi
exit "$failed"
