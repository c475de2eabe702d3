#!/usr/bin/env bash
# The SLURM lane (issue 24, item 1): start a one-node SLURM cluster on this machine and check, through sbatch, the
# three ways the runner meets SLURM, as docs/distributed.md, docs/checkpoints.md and docs/sweeps.md describe them:
#   a. one task per process: `srun -n 2 python -m runner hardware=multi_cpu` is one group of 2 with one run dir,
#      ending bitwise equal to `torchrun --nproc_per_node 2`;
#   b. preemption: a stop signal (USR1, as `--signal=USR1@N` sends it) or `scontrol requeue` mid-run stops the run
#      with a checkpoint and exit 75, the job is requeued and resumes (resume=auto), ending bitwise equal to an
#      uninterrupted run;
#   c. a `hydra/launcher=slurm` sweep of 2 trials runs both on the cluster and reports both.
# The checks themselves are in lane_slurm.py; this script installs, starts and stops the cluster.
#
#   bash tests/slurm/check.sh            # from the repo root, the project's venv active (CI: after the test suite)
#
# Needs root (apt-get, the daemons). When slurm-wlm/munge cannot be installed or the daemons do not start, it
# prints one line "SLURM lane SKIPPED: <why>" and exits 0; a failed check exits non-zero. The daemons' config,
# state and logs live in $RUNNER_SLURM_LANE_DIR (default /tmp/runner-slurm-lane), wiped at each start after the
# daemons a killed earlier run left there are stopped; the runs' outputs go to a fresh `mktemp -d`, removed when
# every check passed and kept (its path printed) otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
repo="$PWD"
lane_dir="${RUNNER_SLURM_LANE_DIR:-/tmp/runner-slurm-lane}"
partition=lane
lane_start=$SECONDS
work=""
started_munged=""

# Only the two outcomes the lane may have besides passing: a skip, said on one line, and a failure.
skip() { echo "SLURM lane SKIPPED: $*"; exit 0; }
fail() { echo "SLURM lane FAILED: $*" >&2; exit 1; }
elapsed() { echo "[slurm lane] $1: $(( SECONDS - $2 )) s"; }

echo "[slurm lane] start: $(uptime)"

# --- install -----------------------------------------------------------------------------------------------------
t=$SECONDS
install_log="$(mktemp /tmp/runner-slurm-lane-install.XXXXXX)"
[ "$(id -u)" = 0 ] || skip "not root (installing slurm-wlm/munge and starting their daemons needs root)"
command -v python >/dev/null || skip "no python on PATH (activate the project's venv first)"
if ! dpkg -s slurm-wlm munge >/dev/null 2>&1; then
    command -v apt-get >/dev/null || skip "slurm-wlm/munge are not installed and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh container has no package lists: update only when the plain install cannot find the packages.
    if ! apt-get install -y -q slurm-wlm munge >"$install_log" 2>&1; then
        apt-get update -q >>"$install_log" 2>&1
        apt-get install -y -q slurm-wlm munge >>"$install_log" 2>&1 \
            || skip "apt-get install slurm-wlm munge failed (last line: $(tail -n1 "$install_log"))"
    fi
fi
for tool in munged munge slurmctld slurmd sbatch srun squeue sinfo scontrol scancel; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || skip "$tool missing after installing slurm-wlm munge"
done
export PATH="$PATH:/usr/sbin:/sbin"
python -c "import hydra_plugins.hydra_submitit_launcher" 2>/dev/null \
    || pip install -q -e ".[slurm]" >"$install_log" 2>&1 \
    || skip "pip install -e .[slurm] failed (last line: $(tail -n1 "$install_log"))"
rm -f "$install_log"
command -v torchrun >/dev/null || fail "torchrun is not on PATH: is the project's venv active?"
elapsed install "$t"

# --- the cluster ---------------------------------------------------------------------------------------------------
# Stop a daemon named by one of our pid files, if it still runs (a run killed before its EXIT trap leaves them):
# only that pid, and only if it is that daemon.
stop_pidfile() {  # pidfile name
    local pid
    pid="$(cat "$1" 2>/dev/null)" || return 0
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 0
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do [ -d "/proc/$pid" ] || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
}

# Running jobs first (their slurmstepd would outlive the daemons), then slurmctld and slurmd, then munged if this
# run started it. Then the check of part d: no SLURM daemon of ours is left.
teardown() {
    local rc=$? t=$SECONDS left
    trap - EXIT
    if [ -n "${SLURM_CONF:-}" ] && [ -f "$lane_dir/slurmctld.pid" ]; then
        scancel --partition="$partition" >/dev/null 2>&1
        for _ in $(seq 50); do
            [ -z "$(squeue -h -p "$partition" 2>/dev/null)" ] && break
            sleep 0.2
        done
        scontrol shutdown >/dev/null 2>&1
    fi
    stop_pidfile "$lane_dir/slurmctld.pid" slurmctld
    stop_pidfile "$lane_dir/slurmd.pid" slurmd
    [ -n "$started_munged" ] && stop_pidfile "$lane_dir/munged.pid" munged
    left="$(for daemon in slurmctld slurmd slurmstepd; do pgrep -a -x "$daemon"; done)"
    if [ -n "$left" ]; then
        echo "SLURM lane FAILED: SLURM processes still running after the teardown:" >&2
        echo "$left" >&2
        rc=1
    else
        echo "[slurm lane] teardown: no slurmctld, slurmd or slurmstepd left"
    fi
    elapsed teardown "$t"
    if [ -n "$work" ]; then
        if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "[slurm lane] the runs' outputs are kept in $work" >&2; fi
    fi
    echo "[slurm lane] total: $(( SECONDS - lane_start )) s (exit $rc)"
    echo "[slurm lane] end: $(uptime)"
    exit "$rc"
}

# The whole log of the daemon that did not start, then the skip.
daemon_skip() {  # why, log file
    [ -f "$2" ] && { echo "--- $2 (last 20 lines)"; tail -n 20 "$2"; } >&2
    skip "$1"
}

t=$SECONDS
stop_pidfile "$lane_dir/slurmctld.pid" slurmctld
stop_pidfile "$lane_dir/slurmd.pid" slurmd
stop_pidfile "$lane_dir/munged.pid" munged
rm -rf "$lane_dir"
mkdir -p "$lane_dir/state" "$lane_dir/spool"
trap teardown EXIT
trap 'exit 130' INT TERM

# munge: reuse a munged that already answers (the system's), else start one with the package's key (created here
# when missing) and a socket of our own.
munge_socket=""
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none || skip "cannot write /etc/munge/munge.key"
    fi
    munge_user=root
    id munge >/dev/null 2>&1 && munge_user=munge
    chown "$munge_user": /etc/munge /etc/munge/munge.key && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
    mkdir -p "$lane_dir/munge" && chown "$munge_user": "$lane_dir/munge" && chmod 755 "$lane_dir/munge"
    munge_socket="$lane_dir/munge/munge.socket.2"
    runuser -u "$munge_user" -- munged --force --socket="$munge_socket" --pid-file="$lane_dir/munge/munged.pid" \
        --log-file="$lane_dir/munge/munged.log" --seed-file="$lane_dir/munge/munged.seed" \
        || daemon_skip "munged did not start" "$lane_dir/munge/munged.log"
    cp "$lane_dir/munge/munged.pid" "$lane_dir/munged.pid"
    started_munged=1
    munge -S "$munge_socket" -n | unmunge -S "$munge_socket" >/dev/null 2>&1 \
        || daemon_skip "munged started but does not answer" "$lane_dir/munge/munged.log"
fi

node="$(hostname -s)"
cpus="$(nproc)"
# One node with this machine's CPUs, no cgroups (linuxproc, task/none: works in a container), no accounting;
# CR_Core so that two 1-CPU jobs or tasks run at once. KillWait short: a requeued job's leftovers go quickly.
cat >"$lane_dir/slurm.conf" <<EOF
ClusterName=runnerlane
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
${munge_socket:+AuthInfo=socket=$munge_socket}
StateSaveLocation=$lane_dir/state
SlurmdSpoolDir=$lane_dir/spool
SlurmctldPidFile=$lane_dir/slurmctld.pid
SlurmdPidFile=$lane_dir/slurmd.pid
SlurmctldLogFile=$lane_dir/slurmctld.log
SlurmdLogFile=$lane_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
JobRequeue=1
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=4000 State=UNKNOWN
PartitionName=$partition Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$lane_dir/slurm.conf"

slurmctld -c || daemon_skip "slurmctld did not start" "$lane_dir/slurmctld.log"
slurmd || daemon_skip "slurmd did not start" "$lane_dir/slurmd.log"
deadline=$(( SECONDS + 60 ))
until [ "$(sinfo -h -n "$node" -o '%T' 2>/dev/null)" = idle ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        sinfo >&2
        tail -n 20 "$lane_dir/slurmctld.log" "$lane_dir/slurmd.log" >&2
        skip "node $node not idle 60 s after starting slurmctld and slurmd (sinfo: $(sinfo -h -o '%T' 2>&1))"
    fi
    sleep 0.5
done
echo "[slurm lane] cluster: node $node, $cpus CPUs, partition $partition ($(sinfo --version))"
elapsed cluster "$t"

# --- the checks ----------------------------------------------------------------------------------------------------
work="$(mktemp -d /tmp/runner-slurm-lane-work.XXXXXX)"
for part in a b c; do
    t=$SECONDS
    python tests/slurm/lane_slurm.py "$part" --work "$work/$part" --partition "$partition" \
        || fail "part $part (see above; outputs in $work/$part)"
    elapsed "part $part" "$t"
done
echo "[slurm lane] PASSED"
