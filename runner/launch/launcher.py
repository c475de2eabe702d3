"""Run the workers: in this process for one, through torch's elastic launcher (torchrun's engine) for several; and
`python -m runner.launch`, the same launcher for a user's own script.

    one process                 -> worker.run(spec), here
    started by torchrun / srun  -> worker.run(spec) in every rank, no respawn (RANK etc. already set)
    several processes/machines  -> the elastic agent (runner/launch/agent.py), worker.run_spawned(spec) in each
    hardware.launcher=ray       -> a Ray Train TorchTrainer (runner/launch/ray_train.py), worker.run(spec) in each

The parent has already composed, checked and resolved the config; workers get it frozen, as an argument.

    python -m runner.launch [hardware=multi_cpu|multi_gpu] [hardware.num_processes=N] [gpu_ids=[0,1]] \\
        my_script.py --its-args         (or: -m my_package.train --its-args)

starts N copies of the script with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set, as torchrun does, after
resolving the same hardware settings (and the machine's own defaults) as `python -m runner`. A script that uses
`runner.Accelerator` joins the process group by itself.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from runner.launch import worker
from runner.launch.agent import run_agent
from runner.config import Launcher, RunSpec, StopSignal
from runner.errors import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, LaunchError, Preempted
from runner.launch.failures import PEER_LOST_WORDS, RootCause, root_cause
from runner.distributed.signals import stop_during_startup, stop_signals

log = logging.getLogger(__name__)

RANK_OUTPUT_DIR = "ranks"  # the agent's raw stdout/stderr of every rank, under the run dir


def launch(spec: RunSpec) -> dict[str, float]:
    hardware = spec.hardware
    if hardware.external_launcher:
        warn_shared_store_on_restart()
        return worker.run(spec, keep_process_group=True)
    if spec.config.hardware.launcher is Launcher.ray:
        from runner.launch.ray_train import launch_on_ray

        return launch_on_ray(spec)
    if hardware.launches_processes:
        return elastic_launch(spec)
    return worker.run(spec)


SHARED_STORE_SWITCH = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def warn_shared_store_on_restart() -> None:
    """A group torchrun restarted (--max-restarts) while sharing its rendezvous store with the workers: measured on
    gloo, 1 restart in 3 hung silently and 2 failed with "connection refused" on a stale address in that store;
    with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's own environment every restart was clean. It must be set
    before torchrun starts, so the runner can only say so (its own launcher sets it: agent.fresh_stores_on_restart)."""
    from runner.distributed.dist import external_rank, restart_count

    if restart_count() > 0 and os.environ.get(SHARED_STORE_SWITCH) != "1" and external_rank() in (None, 0):
        log.warning("torchrun restarted this group (restart %d) without %s=1 in its environment: a restarted group "
                    "can hang or fail with \"connection refused\" on a stale address in torch's shared rendezvous "
                    "store; start torchrun as `%s=1 torchrun --max-restarts N ...`", restart_count(),
                    SHARED_STORE_SWITCH, SHARED_STORE_SWITCH)


def elastic_launch(spec: RunSpec) -> dict[str, float]:
    """Start this machine's workers and wait for them; the final metrics of its lowest rank (rank 0 on machine 0;
    every rank holds the same, gathered across all processes)."""
    hardware = spec.hardware
    with stop_during_startup():
        data_s = worker.prepare_data(spec.config)  # generate and cache once, here, before the ranks read it
    log.info(
        "launching %d worker process(es) on machine %d of %d (%s start) from pid %d, the data built here once "
        "(%.1f s) for them to read from the datasets cache; their logs: %s",
        hardware.processes_per_machine, hardware.machine_rank, hardware.num_machines, hardware.start_method.value,
        os.getpid(), data_s, Path(spec.run_dir) / "runner_rank<N>.log",
    )
    outcome = run_agent(hardware, Path(spec.run_dir) / RANK_OUTPUT_DIR, worker.run_spawned, (spec,),
                        stop_signals(spec.config.checkpoint.stop_signals), rank0_console=True)
    if outcome.results is not None:
        return outcome.results[min(outcome.results)]
    stopped, failure = _ended(outcome)
    if stopped:
        raise Preempted(stopped, *_last_checkpoint(spec)) from None
    rank_log = Path(spec.run_dir) / f"runner_rank{failure.rank}.log"
    err = LaunchError(f"{failure.message}\n  its full log: {rank_log}")
    err.keep = (rank_log,)  # a failure before training removes the new run dir, but not the log named here
    err.resume_helps = failure.resume_helps
    raise err from None


def _ended(outcome) -> tuple[str | None, RootCause | None]:
    """What the workers' exit codes say when they did not all return: all 75 (they stopped and sealed their
    checkpoint: the signal's name), all 130 (Ctrl-C: KeyboardInterrupt), or the root cause of a failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    err = outcome.error
    if not isinstance(err, ChildFailedError):  # the rendezvous itself failed (a machine never came, a port taken)
        raise LaunchError(f"the workers could not start: {type(err).__name__}: {err}") from None
    codes = {failure.exitcode for failure in err.failures.values()}
    if codes == {PREEMPTED_EXIT_CODE}:
        return (outcome.forwarded[0].name if outcome.forwarded else "a stop signal"), None
    if codes == {INTERRUPTED_EXIT_CODE}:
        raise KeyboardInterrupt
    return None, root_cause(err.failures, outcome.exited)


def _last_checkpoint(spec: RunSpec) -> tuple[int | None, Path | None]:
    from runner.checkpoint import newest_complete_step
    from runner.checkpoint.files import checkpoint_name

    checkpoints = Path(spec.run_dir) / "checkpoints"
    step = newest_complete_step(checkpoints)
    saved = checkpoints / checkpoint_name(step) if step is not None and spec.config.checkpoint.enabled else None
    return step, saved


# -- python -m runner.launch: a user's own script ------------------------------------------------------------------


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the runner's overrides, the script's command): overrides come first, as `key=value` (or `group=option`);
    the command starts at the first argument that is not one (`my_script.py` or `-m`), and is passed on as is."""
    for index, argument in enumerate(argv):
        if argument.startswith("-") or "=" not in argument:
            return argv[:index], argv[index:]
    return argv, []


def main(argv: list[str] | None = None) -> None:
    from runner.run.compose import load
    from runner.distributed.dist import adopt_slurm_tasks, skypilot_machine_overrides
    from runner.errors import RunnerError, exit_with, no_stray_tracebacks
    from runner.launch.shutdown import skip_collection_at_exit

    no_stray_tracebacks()
    skip_collection_at_exit()
    adopt_slurm_tasks()
    overrides, command = split_command(sys.argv[1:] if argv is None else argv)
    overrides += skypilot_machine_overrides(overrides)  # a SkyPilot task's nodes are the machines
    usage = ("usage: python -m runner.launch [hardware=... hardware.num_processes=N gpu_ids=[...]] "
             "my_script.py [its arguments]   (or: -m my_package.module [its arguments])")
    if command[:1] in (["-h"], ["--help"]):
        print(usage)
        raise SystemExit(0)
    if not command or command == ["-m"]:
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    try:
        if command[0] != "-m" and not Path(command[0]).expanduser().is_file():  # before any rank starts
            raise LaunchError(f"no script '{command[0]}' (looked in {Path(command[0]).expanduser().resolve().parent}); "
                              "give the path of your script, or -m my_package.module")
        spec = load(overrides)
        hardware = spec.hardware
        if spec.config.hardware.launcher is not Launcher.runner:
            raise LaunchError(f"hardware.launcher: is {spec.config.hardware.launcher.value}, which starts the "
                              "runner's own workers (python -m runner); runner launch starts your script's ranks "
                              "with torch's elastic launcher only: leave hardware.launcher out here")
        if hardware.external_launcher:
            raise LaunchError("python -m runner.launch was itself started by torchrun or srun, which already started one "
                              "process per rank: run the script directly under it instead")
        hardware.apply()
        # The precision of this machine's config (`runner machine set precision=bf16`) or the command line reaches
        # the script's Accelerator() as `accelerate launch` passes its own: through this variable.
        os.environ[PRECISION_VARIABLE] = accelerate_precision(spec.config.precision.kind.value)
        code = _launch_script(hardware, command)
    except RunnerError as err:
        exit_with(err)
    except KeyboardInterrupt:
        print("runner: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    except Preempted as stop:  # a stop signal before the script's ranks started (waiting for other machines)
        print(f"runner: {stop}", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT_CODE)
    raise SystemExit(code)


PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"  # Accelerate's name, read by runner.Accelerator() too


def accelerate_precision(kind: str) -> str:
    return "no" if kind == "fp32" else kind


def _launch_script(hardware, command: list[str]) -> int:
    """Run the script on this machine's processes; its exit code (0, 75 when every rank stopped for a signal)."""
    log_dir = Path("outputs") / "launch" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S") / RANK_OUTPUT_DIR
    print(f"runner: {hardware.world_size} process(es) of {' '.join(command)}; their output: {log_dir}",
          file=sys.stderr)
    # Passed on to the script's ranks (they decide what a signal means); SIGUSR2 too under submitit.
    forwarded = stop_signals([StopSignal.SIGTERM, StopSignal.SIGUSR1])
    # Each rank goes through runner.launch.rank_exec, which ties its life to this process's, then becomes the script.
    ranks_command = ("-m", "runner.launch.rank_exec", str(os.getpid()), *command)
    outcome = run_agent(hardware, log_dir.resolve(), sys.executable, ranks_command, forwarded)
    if outcome.results is not None:
        return 0
    stopped, _ = _ended(outcome)
    if stopped:
        return PREEMPTED_EXIT_CODE
    failures = outcome.error.failures
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda path: int(path.name.split("_")[-1]))
    attempt = attempts[-1] if attempts else None  # torch's layout: <run id>/attempt_<n>/<local rank>/stderr.log
    tails = {rank: _tail(attempt / str(failure.local_rank) / "stderr.log") for rank, failure in failures.items()
             } if attempt else {}
    where = f"{attempt}/<local rank>/stderr.log" if attempt else str(log_dir)
    raise LaunchError(f"{script_failure(failures, outcome.exited, tails)}\n  their output: {where}")


def script_failure(failures: dict[int, object], exited: dict[int, float], stderr_tails: dict[int, str] | None = None,
                   ) -> str:
    """How each rank of a user's script ended, the one that failed first named first: a script leaves no report
    of its own (unless it uses torch's @record), and once one rank fails the others fail on losing it, or are
    ended by the launcher. A rank whose output ends in a lost connection (`stderr_tails`: {rank: the end of its
    stderr}) failed because of another: its own exit may still come first, while the rank that raised is shutting
    down. `failures`: the launcher's {rank: ProcessFailure}; `exited`: {pid: exit time}."""
    ended_by_launcher = (-signal.SIGTERM, -signal.SIGKILL)
    tails = stderr_tails or {}
    lost_peer = {rank for rank, tail in tails.items() if any(words in tail for words in PEER_LOST_WORDS)}

    def order(item) -> tuple:
        rank, failure = item
        # SIGTERM is how the launcher ends the others once one rank has failed, so a rank it ended comes after
        # those that ended by themselves, whatever the exit times say: a rank's exit is timed by a thread of the
        # launcher that can wake late under load. SIGKILL keeps its time: the kernel's OOM killer sends it too.
        return (rank in lost_peer, failure.exitcode == -signal.SIGTERM, exited.get(failure.pid, float("inf")),
                failure.exitcode in ended_by_launcher, failure.timestamp, rank)

    def how(rank: int, failure) -> str:
        if rank in lost_peer:
            return _how(failure) + " (it lost its connection to another rank)"
        raised = _raised(tails.get(rank, ""))
        if raised:  # the launcher may have ended it while it was still shutting down
            return f"raised {raised}" + (f" (then {_how(failure)})" if failure.exitcode < 0 else "")
        return _how(failure)

    (first, failure), *others = sorted(failures.items(), key=order)
    text = f"rank {first} failed first: it {how(first, failure)}"
    if others:
        text += "; then " + "; ".join(f"rank {rank} {how(rank, other)}" for rank, other in others)
    return text


def _how(failure) -> str:
    if failure.exitcode < 0:
        return f"was killed by signal {failure.signal_name()}"
    return f"exited with code {failure.exitcode}"


def _raised(tail: str) -> str:
    """The exception line that ends the last traceback in a rank's stderr (`[rankN]:` prefixes dropped), or ""."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in tail.splitlines()]
    starts = [index for index, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return ""
    ends = [line for line in lines[starts[-1] + 1:] if line.strip() and not line[0].isspace()]
    return ends[-1].strip() if ends else ""


def _tail(path: Path, size: int = 4096) -> str:
    """The end of a rank's stderr (its last traceback), or "" where there is none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
