#!/usr/bin/env bash
# The SLURM lane (issue 24, item 1): start a one-node SLURM cluster on this machine and check, through sbatch, the
# three ways the runner meets SLURM, as docs/distributed.md, docs/checkpoints.md and docs/sweeps.md describe them:
#   a. one task per process: `srun -n 2 python -m runner hardware=multi_cpu` is one group of 2 with one run dir,
#      ending bitwise equal to `torchrun --nproc_per_node 2` (and `srun -n 2 ... hardware=cpu` is refused);
#   b. preemption: SIGUSR1 (what `--signal=USR1@N` sends) or `scontrol requeue` mid-run stops the run with a
#      checkpoint and exit 75, the job runs again and resumes (resume=auto), ending bitwise equal to an
#      uninterrupted run;
#   c. a `hydra/launcher=slurm` sweep of 2 trials runs both as jobs of the cluster and reports both;
#   d. a `hydra/launcher=slurm` trial sent submitit's time-limit signal (SIGUSR2) saves, is requeued by submitit,
#      resumes and completes, and the sweep ends;
# and the daemons are stopped at the end, with no SLURM process of the lane left.
# The checks of a-d are in lane_slurm.py; this script installs, starts and stops the cluster and times each part.
#
#   bash tests/slurm/check.sh            # from the repo root, the project's venv active (CI: after the test suite)
#   bash tests/slurm/check.sh b          # only part b (any of a b c d, run in the order given)
#
# Needs root (apt-get, the daemons). The last line is the verdict: "SLURM lane PASSED", "SLURM lane FAILED: ..."
# (exit 1), or "SLURM lane SKIPPED: <why>" (exit 0) when slurm-wlm/munge or the slurm extra cannot be installed or
# the daemons do not start. The daemons' config, state and logs live in $RUNNER_SLURM_LANE_DIR (default
# /tmp/runner-slurm-lane), wiped at each start once whatever a killed earlier run left running from it is stopped;
# the runs' outputs go to a fresh `mktemp -d`, removed when the lane passed and kept (its path printed) otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
lane_dir="${RUNNER_SLURM_LANE_DIR:-/tmp/runner-slurm-lane}"
partition=lane
lane_start=$SECONDS
export PATH="$PATH:/usr/sbin:/sbin"  # the daemons, for a non-login root shell

work=""            # the runs' outputs, once the checks start
install_log=""     # apt-get's and pip's output while installing
cluster=""         # "started" once slurmctld is started, "up" once its node is idle
started_munged=""  # set when this run started munged (a munged that already answered is left alone)
verdict=""         # PASSED once every part passed; "SKIPPED: why" / "FAILED: why" otherwise

skip() { verdict="SKIPPED: $*"; exit 0; }
# uptime is procps, not in every container; the load average is what matters.
load() { uptime 2>/dev/null || echo "load average (/proc/loadavg): $(cat /proc/loadavg)"; }
fail() { verdict="FAILED: $*"; exit 1; }
elapsed() { echo "[slurm lane] $1: $(( SECONDS - $2 )) s"; }

# This script and the shells that started it: never counted as the lane's processes, even when one of them was
# started with the lane's SLURM_CONF in its environment.
ancestors=" "
pid=$$
while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
    ancestors+="$pid "
    pid="$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)"
done

# Every process started under the lane's slurm.conf: the daemons, the job steps' slurmstepd and the jobs
# themselves (all inherit SLURM_CONF from this script). How leftovers are found, by pid, whatever killed a run.
lane_processes() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid="${environ#/proc/}" && pid="${pid%/environ}"
        case "$ancestors" in *" $pid "*) continue ;; esac
        [ "$pid" = "$BASHPID" ] && continue
        { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$lane_dir/slurm.conf" && echo "$pid"
    done
}

# "pid command line" of each process with one of these names (/proc, as pgrep -a -x; no procps needed).
# Zombies (exited, waiting for their parent to reap them) are not counted.
procs_named() {
    local comm pid name wanted
    for comm in /proc/[0-9]*/comm; do
        name="$(cat "$comm" 2>/dev/null)" || continue
        pid="${comm#/proc/}" && pid="${pid%/comm}"
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && continue
        for wanted in "$@"; do
            [ "$name" = "$wanted" ] && echo "$pid $( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)"
        done
    done
}

# TERM, then KILL after 5 s, the given pids (those still alive).
stop_pids() {
    local pid alive
    [ "$#" -gt 0 ] || return 0
    kill "$@" 2>/dev/null
    for _ in $(seq 50); do
        alive=""
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ -n "$alive" ] || return 0
        sleep 0.1
    done
    kill -9 "$@" 2>/dev/null
}

# munged is started before SLURM_CONF exists: found by its pid file, and only if that pid is still munged.
stop_munged() {
    local pid
    pid="$(cat "$lane_dir/munge/munged.pid" 2>/dev/null)" || return 0
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ] && stop_pids "$pid"
}

# Part d, on every exit: cancel the jobs (their slurmstepd would outlive the daemons), shut the daemons down,
# check that nothing of the lane is left (what is, is named, stopped and fails the lane), then the verdict.
teardown() {
    local rc=$? t=$SECONDS left jobs_left pid
    trap - EXIT
    [ -n "$verdict" ] || verdict="FAILED: exit $rc"
    if [ "$cluster" = up ]; then
        scancel --partition="$partition" >/dev/null 2>&1
        for _ in $(seq 100); do
            jobs_left="$(squeue -h -p "$partition" 2>/dev/null)" || break
            [ -z "$jobs_left" ] && break
            sleep 0.2
        done
        scontrol shutdown >/dev/null 2>&1
        for _ in $(seq 100); do
            [ -z "$(lane_processes)" ] && break
            sleep 0.2
        done
    fi
    # A cluster that never came up (the lane is skipped) is simply stopped; one that did must have gone by now.
    left="$(lane_processes)"
    if [ -n "$left" ]; then
        if [ "$cluster" = up ]; then
            echo "[slurm lane] still running 20 s after scancel and scontrol shutdown (now killed):" >&2
            for pid in $left; do echo "$pid $( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)"; done >&2
            verdict="FAILED: SLURM processes were left running after the teardown"
        fi
        # shellcheck disable=SC2086
        stop_pids $left
    fi
    [ -n "$started_munged" ] && stop_munged
    left="$(procs_named slurmctld slurmd slurmstepd)"
    if [ -n "$left" ]; then
        echo "[slurm lane] SLURM daemons running after the teardown (not the lane's: $lane_dir/slurm.conf):" >&2
        echo "$left" >&2
        verdict="FAILED: SLURM daemons left running after the teardown"
    elif [ -n "$cluster" ]; then
        echo "[slurm lane] teardown: no slurmctld, slurmd or slurmstepd left"
    fi
    elapsed teardown "$t"
    case "$verdict" in
        PASSED) rc=0 ;;
        SKIPPED*) rc=0 ;;
        *) rc=1; [ -n "$work" ] && echo "[slurm lane] the runs' outputs are kept in $work" ;;
    esac
    [ "$rc" = 0 ] && [ -n "$work" ] && rm -rf "$work"
    [ -n "$install_log" ] && [[ "$verdict" != SKIPPED* ]] && rm -f "$install_log"
    echo "[slurm lane] total: $(( SECONDS - lane_start )) s"
    echo "[slurm lane] end: $(load)"
    echo "SLURM lane $verdict"
    exit "$rc"
}
trap teardown EXIT
trap 'verdict="FAILED: interrupted"; exit 130' INT TERM

echo "[slurm lane] start: $(load)"

# --- install -----------------------------------------------------------------------------------------------------
t=$SECONDS
[ "$(id -u)" = 0 ] || skip "not root (installing slurm-wlm/munge and starting their daemons needs root)"
command -v python >/dev/null || skip "no python on PATH (activate the project's venv first)"
install_log="$(mktemp /tmp/runner-slurm-lane-install.XXXXXX)"  # kept only when the install is why it skipped
if ! dpkg -s slurm-wlm munge >/dev/null 2>&1; then
    command -v apt-get >/dev/null || skip "slurm-wlm/munge are not installed and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh container has no package lists: update only when the plain install cannot find the packages.
    if ! apt-get install -y -q slurm-wlm munge >"$install_log" 2>&1; then
        apt-get update -q >>"$install_log" 2>&1
        apt-get install -y -q slurm-wlm munge >>"$install_log" 2>&1 \
            || skip "apt-get install slurm-wlm munge failed (last line: $(tail -n1 "$install_log"); log: $install_log)"
    fi
fi
for tool in munged munge unmunge slurmctld slurmd sbatch srun squeue sinfo scontrol scancel; do
    command -v "$tool" >/dev/null || skip "$tool missing after installing slurm-wlm and munge"
done
python -c "import hydra_plugins.hydra_submitit_launcher" 2>/dev/null \
    || pip install -q -e ".[slurm]" >"$install_log" 2>&1 \
    || skip "pip install -e .[slurm] failed (last line: $(tail -n1 "$install_log"); log: $install_log)"
rm -f "$install_log"
install_log=""
command -v torchrun >/dev/null || fail "torchrun is not on PATH: is the project's venv active?"
elapsed install "$t"

# --- the cluster ---------------------------------------------------------------------------------------------------
t=$SECONDS
# What a run killed before its teardown left running (daemons, jobs), then its files.
# shellcheck disable=SC2046
stop_pids $(lane_processes)
stop_munged
others="$(procs_named slurmctld slurmd)"
[ -z "$others" ] || skip "SLURM daemons the lane did not start run here already: $(echo $others)"
rm -rf "$lane_dir"
mkdir -p "$lane_dir/state" "$lane_dir/spool"

# The daemons' logs (last lines), then the skip.
daemon_skip() {  # why, log files...
    local log
    for log in "${@:2}"; do
        [ -f "$log" ] && { echo "--- $log (last 20 lines)"; tail -n 20 "$log"; } >&2
    done
    skip "$1"
}

# Whether the daemon of this pid file runs (they daemonize first, so a failure to start shows only afterwards).
alive() {  # pidfile, name
    local pid
    pid="$(cat "$1" 2>/dev/null)" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

# munge: reuse a munged that already answers (the system's), else start one on a socket of our own, with the
# package's key (created when missing; the chown/chmod munged insists on are idempotent).
munge_socket=""
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none \
            || skip "cannot write /etc/munge/munge.key"
    fi
    munge_user=root
    id munge >/dev/null 2>&1 && munge_user=munge
    chown "$munge_user": /etc/munge /etc/munge/munge.key && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
    mkdir -p "$lane_dir/munge" && chown "$munge_user": "$lane_dir/munge" && chmod 755 "$lane_dir/munge"
    munge_socket="$lane_dir/munge/munge.socket.2"
    started_munged=1
    runuser -u "$munge_user" -- munged --force --socket="$munge_socket" --pid-file="$lane_dir/munge/munged.pid" \
        --log-file="$lane_dir/munge/munged.log" --seed-file="$lane_dir/munge/munged.seed" \
        || daemon_skip "munged did not start" "$lane_dir/munge/munged.log"
    munge -S "$munge_socket" -n | unmunge -S "$munge_socket" >/dev/null 2>&1 \
        || daemon_skip "munged started but does not answer" "$lane_dir/munge/munged.log"
fi

node="$(uname -n | cut -d. -f1)"  # as `hostname -s`: the name slurmd looks for in slurm.conf
cpus="$(nproc)"
# One node with this machine's CPUs, no cgroups (linuxproc, task/none: works in a container), no accounting;
# CR_Core so that two 1-CPU jobs or tasks run at once. cred_expire is also how long a requeued job waits before it
# may start again (120 s by default, slurm.conf(5)); KillWait short: a requeued job's leftovers go quickly.
# MinJobAge keeps finished jobs in `scontrol show job` for the checks.
cat >"$lane_dir/slurm.conf" <<EOF
ClusterName=runnerlane
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10${munge_socket:+,socket=$munge_socket}
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

cluster=started
slurmctld -c || daemon_skip "slurmctld did not start" "$lane_dir/slurmctld.log"
slurmd || daemon_skip "slurmd did not start" "$lane_dir/slurmd.log"
deadline=$(( SECONDS + 60 ))
until [ "$(sinfo -h -n "$node" -o '%T' 2>/dev/null)" = idle ]; do
    sleep 0.5
    for daemon in slurmctld slurmd; do
        alive "$lane_dir/$daemon.pid" "$daemon" || daemon_skip "$daemon stopped after starting" "$lane_dir/$daemon.log"
    done
    [ "$SECONDS" -lt "$deadline" ] || daemon_skip "node $node not idle 60 s after starting slurmctld and slurmd" \
        "$lane_dir/slurmctld.log" "$lane_dir/slurmd.log"
done
cluster=up
echo "[slurm lane] cluster: node $node, $cpus CPUs, partition $partition ($(sinfo --version))"
elapsed cluster "$t"

# --- the checks ----------------------------------------------------------------------------------------------------
work="$(mktemp -d /tmp/runner-slurm-lane-work.XXXXXX)"
for part in ${*:-a b c d}; do
    t=$SECONDS
    python tests/slurm/lane_slurm.py "$part" --work "$work/$part" --partition "$partition" \
        || fail "part $part (see above; its outputs: $work/$part)"
    elapsed "part $part" "$t"
done
verdict=PASSED
