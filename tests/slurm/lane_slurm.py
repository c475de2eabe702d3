"""The checks of the SLURM lane, one part per call, against the cluster tests/slurm/check.sh started (SLURM_CONF set):

    python tests/slurm/lane_slurm.py a --work DIR --partition lane   # srun's tasks are one training
    python tests/slurm/lane_slurm.py b --work DIR --partition lane   # preemption, requeue and resume
    python tests/slurm/lane_slurm.py c --work DIR --partition lane   # a hydra/launcher=slurm sweep
    python tests/slurm/lane_slurm.py d --work DIR --partition lane   # submitit's time-limit signal in a sweep

Each part submits small runs of the default recipe with sbatch into DIR, waits for them with a deadline, and checks
what the docs promise (docs/distributed.md, docs/checkpoints.md, docs/sweeps.md). Weights are compared exactly
(torch.equal on every tensor of export/final.safetensors). A failed check prints what it compared, the tail of the
job's output, and exits 1. Named lane_slurm.py, not test_*.py, so the main `python -m pytest` does not collect it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Seconds of training each, on 2 cores: the default recipe with a small validation split and no loggers.
SMALL = ["data.num_validation=256", "logger=[]", "trainer.progress_bar=false"]

# Job states after which SLURM does nothing more with a job (a requeued job passes through REQUEUED and PENDING).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


class LaneFailure(Exception):
    """A check of the lane failed; the message says what was compared."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise LaneFailure(message)


def say(message: str) -> None:
    print(f"[slurm lane] {message}", flush=True)


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """A command that must succeed; its output is kept for the failure message."""
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    check(done.returncode == 0, f"`{shlex.join(cmd)}` exited {done.returncode}:\n{done.stdout[-3000:]}"
                                f"{done.stderr[-3000:]}")
    return done


def sbatch(work: Path, script: str, overrides: list[str], options: list[str]) -> str:
    """Submit one of the lane's scripts with the runner's overrides; returns the job id. The output file is appended
    to (not truncated) so a requeued job's file holds every start."""
    out = run(["sbatch", "--parsable", f"--chdir={work}", f"--output={work}/slurm-%j.out", "--open-mode=append",
               *options, str(HERE / script), *overrides])
    job = out.stdout.strip().split(";")[0]
    check(job.isdigit(), f"sbatch printed no job id: {out.stdout!r}")
    return job


def job_info(job: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (the first record: an array job's own)."""
    text = run(["scontrol", "show", "job", "-o", job]).stdout.splitlines()[0]
    return dict(re.findall(r"(\w+)=(\S*)", text))


def job_output(work: Path, job: str) -> str:
    """The job's output: the lane's own jobs write slurm-<id>.out into `work`, submitit's write <id>_0_log.out and
    .err into their own folder (pass that as `work`)."""
    paths = [work / f"slurm-{job}.out"] if (work / f"slurm-{job}.out").exists() else sorted(work.glob("*_log.*"))
    if not paths:
        return f"(no output file for job {job} in {work})"
    return "\n".join(path.read_text(errors="replace") for path in paths)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def wait_job(work: Path, job: str, deadline_s: float) -> dict[str, str]:
    """Wait until the job reaches a final state; a job still running at the deadline, or held instead of being
    requeued, fails the check."""
    end = time.monotonic() + deadline_s
    while True:
        info = job_info(job)
        if info.get("JobState") in FINAL_STATES:
            return info
        check("Held" not in info.get("Reason", ""),
              f"job {job} is held ({info.get('Reason')}) instead of running again:\n{tail(job_output(work, job))}")
        check(time.monotonic() < end,
              f"job {job} not finished after {deadline_s:.0f} s (state {info.get('JobState')}, reason "
              f"{info.get('Reason')}):\n{tail(job_output(work, job))}")
        time.sleep(0.5)


def expect_completed(work: Path, job: str, info: dict[str, str], what: str) -> None:
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"{what}: job {job} ended {info.get('JobState')} with exit code {info.get('ExitCode')}, expected "
          f"COMPLETED 0:0; its output:\n{tail(job_output(work, job))}")


def wait_for(condition, what: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        check(time.monotonic() < end, f"{what}: not seen within {deadline_s:.0f} s")
        time.sleep(0.1)


def same_weights(got: Path, want: Path, what: str) -> None:
    """Every tensor of `got` bitwise equal to the one of the same name in `want`."""
    import torch
    from safetensors.torch import load_file

    check(got.is_file(), f"{what}: no {got}")
    check(want.is_file(), f"{what}: no {want} (the reference)")
    a, b = load_file(got), load_file(want)
    check(a.keys() == b.keys(), f"{what}: tensor names differ between {got} and {want}: "
                                f"only in the first {sorted(a.keys() - b.keys())}, only in the second "
                                f"{sorted(b.keys() - a.keys())}")
    for name in sorted(a):
        x, y = a[name], b[name]
        if not torch.equal(x, y):
            detail = (f"max abs difference {(x.double() - y.double()).abs().max().item():.3e}"
                      if x.shape == y.shape else f"shapes {tuple(x.shape)} and {tuple(y.shape)}")
            raise LaneFailure(f"{what}: tensor {name!r} of {got} is not bitwise equal to {want}'s ({detail})")
    say(f"{what}: {len(a)} tensors bitwise equal ({got.parent.parent.name} vs {want.parent.parent.name})")


def part_a(work: Path, partition: str) -> None:
    """`srun -n 2 python -m runner hardware=multi_cpu`: one process group of 2, one run dir, the weights of
    `torchrun --nproc_per_node 2`; and `srun -n 2` of a one-process config refused, not trained twice."""
    # With the progress shown, a line each step: the job's output is a file, so it gets lines, not a bar's redraws.
    progress = [*(o for o in SMALL if not o.startswith("trainer.progress_bar")), "trainer.progress_every_s=0"]
    overrides = ["hardware=multi_cpu", "trainer.max_steps=40", *progress]
    job = sbatch(work, "ranks.sbatch", overrides, [f"--partition={partition}", "--ntasks=2", "--cpus-per-task=1"])
    # In a folder of its own: it must not add a run dir next to the one checked below.
    refused_dir = work / "refused"
    refused_dir.mkdir()
    refused = sbatch(refused_dir, "ranks.sbatch", ["hardware=cpu", "trainer.max_steps=40", *SMALL],
                     [f"--partition={partition}", "--ntasks=2", "--cpus-per-task=1"])
    say(f"part a: jobs {job} (srun -n 2, hardware=multi_cpu) and {refused} (srun -n 2, hardware=cpu) submitted")
    # The reference, while the jobs run: torchrun's own rendezvous on this machine, outside SLURM.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    done = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "runner", *overrides,
                           "hydra.run.dir=torchrun"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=180)
    check(done.returncode == 0, f"the reference `torchrun --nproc_per_node 2 -m runner` exited {done.returncode}:\n"
                                f"{tail(done.stdout + done.stderr)}")

    info = wait_job(work, job, 120)
    expect_completed(work, job, info, "srun -n 2 hardware=multi_cpu")
    run_dirs = sorted(p.name for p in (work / "outputs").iterdir())
    check(run_dirs == [f"slurm-{job}.0"],
          f"srun -n 2: expected one run dir outputs/slurm-{job}.0 (docs/distributed.md), found {run_dirs}")
    run_dir = work / "outputs" / run_dirs[0]
    logs = sorted(p.name for p in run_dir.glob("runner*.log"))
    check(logs == ["runner_rank0.log", "runner_rank1.log"],
          f"srun -n 2: expected one log per rank (runner_rank0.log, runner_rank1.log) in {run_dir}, found {logs}")
    pids = set()
    for rank in (0, 1):
        log = (run_dir / f"runner_rank{rank}.log").read_text()
        joined = re.search(rf"rank {rank} of 2 \(local rank {rank}\), pid (\d+)", log)
        check(joined is not None, f"srun -n 2: runner_rank{rank}.log does not say 'rank {rank} of 2 (local rank "
                                  f"{rank}), pid N':\n{tail(log, 20)}")
        pids.add(joined.group(1))
    check(len(pids) == 2, f"srun -n 2: both ranks report the same pid {pids}")
    log = (run_dir / "runner_rank0.log").read_text()
    check("64 global per optimizer step = 32 per device x 2 process(es)" in log,
          f"srun -n 2: rank 0's log does not describe one group of 2 processes sharing the batch:\n{tail(log, 20)}")
    same_weights(run_dir / "export" / "final.safetensors", work / "torchrun" / "export" / "final.safetensors",
                 "srun -n 2 vs torchrun --nproc_per_node 2")
    output = job_output(work, job)
    steps = re.findall(r"train: step (\d+)/40 ", output)
    check(steps == [str(step) for step in range(1, 41)] and "\r" not in output,
          f"srun -n 2: expected rank 0's progress as one line a step (train: step 1/40 .. 40/40) and no carriage "
          f"return in slurm-{job}.out, found steps {steps}:\n{tail(output)}")
    say(f"part a: slurm-{job}.out has rank 0's progress as {len(steps)} lines, no carriage return")

    info = wait_job(refused_dir, refused, 120)
    output = job_output(refused_dir, refused)
    refusal = re.search(r"runner: error: .*cpu runs one process.*started 2", output)
    check(info.get("JobState") == "FAILED" and refusal is not None,
          f"srun -n 2 hardware=cpu: expected the job to fail with 'runner: error: ... cpu runs one process ... "
          f"started 2', got "
          f"{info.get('JobState')} {info.get('ExitCode')}:\n{tail(output)}")
    written = sorted(str(p.relative_to(refused_dir)) for p in refused_dir.glob("outputs/*/checkpoints"))
    check(not written, f"srun -n 2 hardware=cpu: refused, yet it wrote checkpoints: {written}")
    say(f"part a: srun -n 2 hardware=cpu refused: {refusal.group(0)}")


def first_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest").exists()


def part_b(work: Path, partition: str) -> None:
    """Preemption: a job stopped mid-run by SIGUSR1 (what --signal=USR1@N sends) and one by `scontrol requeue`
    (SIGTERM) each save, exit 75, run again and resume, ending bitwise equal to the same job uninterrupted."""
    # Long enough (seconds) that the stop lands mid-run; a checkpoint every 50 steps tells when training is going.
    overrides = ["trainer.max_steps=800", "checkpoint.every_n_steps=50", *SMALL]
    # SLURM checks time limits every 30 s, so a --signal=USR1@N before a short --time would land anywhere in a
    # 30 s window: the job asks for it (far away) and the lane sends the same signal to the same processes (the
    # job's steps) with scancel once the first checkpoint is on disk.
    options = [f"--partition={partition}", "--ntasks=1", "--cpus-per-task=1", "--requeue", "--signal=USR1@60",
               "--time=10"]
    usr1 = sbatch(work, "requeue.sbatch", overrides, options)
    requeued = sbatch(work, "requeue.sbatch", overrides, options)
    say(f"part b: jobs {usr1} (to get SIGUSR1) and {requeued} (to be requeued) submitted")

    stops = {usr1: ["scancel", "--signal=USR1", usr1], requeued: ["scontrol", "requeue", requeued]}
    for job, stop in stops.items():
        run_dir = work / "outputs" / f"job-{job}"
        wait_for(lambda: first_checkpoint(run_dir), f"job {job}: first checkpoint in {run_dir}", 120)
        run(stop)
        say(f"part b: `{shlex.join(stop)}` after the first checkpoint of job {job}")
    # The reference starts now (the node has 2 CPUs), from the same script.
    reference = sbatch(work, "requeue.sbatch", overrides, options)

    for job, signal_name in ((usr1, "SIGUSR1"), (requeued, "SIGTERM")):
        what = f"job {job} stopped by {signal_name}"
        info = wait_job(work, job, 180)
        expect_completed(work, job, info, what)
        output = job_output(work, job)
        check(info.get("Restarts") == "1" and "start 2 (SLURM_RESTART_COUNT=1)" in output,
              f"{what}: expected two starts (scontrol Restarts=1, the second start in the job's output), got "
              f"Restarts={info.get('Restarts')}:\n{tail(output)}")
        # The runner says why it stopped on stderr (the job's output), not in runner.log.
        stopped = re.search(rf"runner: stopped by {signal_name} after optimizer step (\d+); saved \S+", output)
        check(stopped is not None,
              f"{what}: the job's output has no 'runner: stopped by {signal_name} after optimizer step N; saved "
              f"...':\n{tail(output)}")
        step = int(stopped.group(1))
        check(step < 800, f"{what}: the stop came after the last step ({step}): the signal did not land mid-run")
        check("Exited with exit code 75" in output,
              f"{what}: srun does not report exit code 75 for the first start:\n{tail(output)}")
        log = (work / "outputs" / f"job-{job}" / "runner.log").read_text()
        check(re.search(r"resum\w* .*step_0*" + str(step), log) is not None,
              f"{what}: runner.log does not say it resumed from step {step}:\n{tail(log)}")
        say(f"part b: {what} after step {step}, exited 75, requeued, resumed from step {step}")

    info = wait_job(work, reference, 180)
    expect_completed(work, reference, info, "the uninterrupted reference")
    check(info.get("Restarts") == "0", f"the uninterrupted reference {reference} ran {info.get('Restarts')} times")
    want = work / "outputs" / f"job-{reference}" / "export" / "final.safetensors"
    for job, signal_name in ((usr1, "SIGUSR1"), (requeued, "SIGTERM")):
        same_weights(work / "outputs" / f"job-{job}" / "export" / "final.safetensors", want,
                     f"stopped by {signal_name} and resumed vs uninterrupted")


def part_c(work: Path, partition: str) -> None:
    """`python -m runner -m hydra/launcher=slurm`, two trials: both run as jobs of this cluster, both are in the
    sweep report with their metric."""
    sweep_dir = work / "sweep"
    # One CPU and 1 GB per trial so that the two fit the node together (the request the hardware group derives is
    # 2 CPUs and 8 GB per process; docs/sweeps.md).
    cmd = [sys.executable, "-m", "runner", "-m", "hydra/launcher=slurm", f"hydra.launcher.partition={partition}",
           "hydra.launcher.timeout_min=5", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
           "optimizer.lr=1e-3,3e-3", "trainer.max_steps=40", *SMALL, f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=240)
    check(done.returncode == 0, f"the sweep `{shlex.join(cmd)}` exited {done.returncode}:\n"
                                f"{tail(done.stdout + done.stderr)}")

    job_dirs = sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    check(len(job_dirs) == 2, f"sweep: expected 2 SLURM array tasks in {sweep_dir}/.submitit, found {job_dirs}")
    for name in job_dirs:
        # submitit returns once a job's result pickle is written, while the job itself may still be exiting.
        info = wait_job(sweep_dir / ".submitit" / name, name, 60)
        check(info.get("JobState") == "COMPLETED" and info.get("Partition") == partition,
              f"sweep: SLURM job {name} is {info.get('JobState')} on partition {info.get('Partition')}, expected "
              f"COMPLETED on {partition}")

    with open(sweep_dir / "sweep_report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    monitor = "val/accuracy"
    check(len(rows) == 2, f"sweep: expected 2 rows in {sweep_dir}/sweep_report.csv, found {len(rows)}: {rows}")
    lrs = sorted(float(row.get("optimizer.lr", "nan")) for row in rows)
    check(lrs == [1e-3, 3e-3], f"sweep: the report's optimizer.lr column is {lrs}, expected [0.001, 0.003]")
    for row in rows:
        check(row["status"] == "completed" and row.get(monitor, "") != "",
              f"sweep: report row for job {row['job']} is {row['status']} with {monitor}={row.get(monitor)!r}, "
              f"expected completed with a value")
        result = json.loads(Path(row["run_dir"], "result.json").read_text())
        check(result["status"] == "completed", f"sweep: {row['run_dir']}/result.json says {result['status']}")
    say(f"part c: SLURM jobs {', '.join(job_dirs)} completed; report: "
        + "; ".join(f"lr={row['optimizer.lr']} {monitor}={row[monitor]}" for row in rows))


def part_d(work: Path, partition: str) -> None:
    """A hydra/launcher=slurm trial that gets submitit's time-limit signal (SIGUSR2, what its `--signal=USR2@120`
    sends) saves a checkpoint, is requeued by submitit, continues from that checkpoint and completes, and the sweep
    ends with it in the report. The runner used to take the signal, exit 75 and leave nothing to requeue the job:
    the sweep then waited forever (no accounting here, so submitit could not tell the job had ended)."""
    sweep_dir = work / "sweep"
    cmd = [sys.executable, "-m", "runner", "-m", "hydra/launcher=slurm", f"hydra.launcher.partition={partition}",
           "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
           "optimizer.lr=1e-3", "trainer.max_steps=600", "checkpoint.every_n_steps=50", *SMALL,
           f"hydra.sweep.dir={sweep_dir}"]
    sweep = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: first_checkpoint(sweep_dir / "0"), f"the trial's first checkpoint in {sweep_dir}/0", 180)
        # The job's folder (<job>; <job>_<task> for an array of trials) is there before its first checkpoint.
        (job,) = [p.name for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)]
        run(["scancel", "--signal=USR2", job])
        say(f"part d: `scancel --signal=USR2 {job}` after the trial's first checkpoint")
        output, _ = sweep.communicate(timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    check(sweep.returncode == 0, f"the sweep `{shlex.join(cmd)}` exited {sweep.returncode}:\n{tail(output)}")
    info = wait_job(sweep_dir / ".submitit" / job, job, 60)
    check(info.get("JobState") == "COMPLETED" and info.get("Restarts") == "1",
          f"SLURM job {job} is {info.get('JobState')} with Restarts={info.get('Restarts')}, expected COMPLETED after "
          f"one requeue")
    job_log = "".join(path.read_text() for path in sorted((sweep_dir / ".submitit" / job).glob("*.err")))
    stopped = re.search(r"runner: stopped by SIGUSR2 after optimizer step (\d+); saved \S+; submitit requeues the "
                        r"job, which continues from it", job_log)
    check(stopped is not None, f"job {job}'s stderr has no 'stopped by SIGUSR2 ... submitit requeues the job':\n"
                               f"{tail(job_log)}")
    step = int(stopped.group(1))
    log = (sweep_dir / "0" / "runner.log").read_text()
    check(re.search(r"resum\w* .*step_0*" + str(step), log) is not None,
          f"the trial's runner.log does not say it resumed from step {step}:\n{tail(log)}")
    with open(sweep_dir / "sweep_report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == 1 and rows[0]["status"] == "completed" and int(rows[0]["steps"]) > step,
          f"sweep: expected one completed trial of more than {step} steps in {sweep_dir}/sweep_report.csv, found "
          f"{rows}")
    say(f"part d: job {job} stopped by SIGUSR2 after step {step}, requeued by submitit, resumed from step {step} "
        f"and completed; the sweep exited 0")


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--work", type=Path, required=True, help="a fresh folder for the jobs' outputs")
    parser.add_argument("--partition", required=True)
    args = parser.parse_args()
    if "SLURM_CONF" not in os.environ:
        print("SLURM_CONF is not set: run this through tests/slurm/check.sh", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True)
    # The lane's cluster binds no CPUs (task/none), so a one-process run would see both cores and start a thread
    # per core: two such jobs at once on 2 cores trained ~100 times slower (50 steps in 46 s instead of 0.3 s).
    # One thread each, as torchrun and the runner's own workers use; the jobs inherit it (sbatch exports ALL).
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        PARTS[args.part](args.work.resolve(), args.partition)
    except LaneFailure as failure:
        print(f"SLURM lane part {args.part} FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
