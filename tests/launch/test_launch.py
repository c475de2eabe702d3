"""runner.launch.launcher (`python -m runner.launch`), runner.launch.failures and the launch checks, without starting processes (the CLI tests start them)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from types import SimpleNamespace

from runner.run.checks import launch_problems
from runner.config import HardwareConfig, HardwareKind, RunConfig, RunSpec, StartMethod
from runner.errors import ConfigError, DataError
from runner.launch.failures import PeerLost, RankFailed, RootCause, mark_step, root_cause, worker_failure
from runner.distributed.devices import resolve_hardware
from runner.distributed.dist import started_by_external_launcher
from runner.launch.agent import launch_config, leave_loky_start_method, omp_threads_for_workers


def _hardware(**fields) -> HardwareConfig:
    return HardwareConfig(**{"kind": HardwareKind.multi_cpu, **fields})


def _spec(tmp_path, **fields) -> RunSpec:
    config = RunConfig(hardware=_hardware(**fields))
    return RunSpec(config=config, run_dir=str(tmp_path), hardware=resolve_hardware(config.hardware))


def test_one_machine_meets_on_a_free_port(tmp_path):
    """With a fresh run id for each launch."""
    first = launch_config(_spec(tmp_path, num_processes=3, start_method=StartMethod.fork, shutdown_timeout_s=7,
                                timeout_s=90).hardware, tmp_path / "ranks", tmp_path / "errors")
    second = launch_config(_spec(tmp_path).hardware, tmp_path / "ranks", tmp_path / "errors")
    assert (first.rdzv_backend, first.rdzv_endpoint) == ("c10d", "localhost:0")  # port 0: never collides
    assert first.run_id != second.run_id
    assert (first.min_nodes, first.max_nodes, first.nproc_per_node, first.max_restarts) == (1, 1, 3, 0)
    assert first.start_method == "fork"  # as asked; the default (auto) is tests/distributed/test_devices.py's
    assert first.shutdown_timeout == 7 and first.rdzv_configs["timeout"] == 90
    assert first.logs_specs.root_log_dir == str(tmp_path / "ranks")


def test_machines_meet_at_machine_0_in_rank_order(tmp_path):
    config = launch_config(_spec(tmp_path, num_processes=4, num_machines=3, machine_rank=2,
                                 main_process_ip="10.0.0.5", main_process_port=29400).hardware, tmp_path / "ranks",
                           tmp_path / "errors")
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (3, 3, 4)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("static", "10.0.0.5:29400")
    assert config.rdzv_configs["rank"] == 2  # this machine holds global ranks 8..11, like torchrun --node-rank
    assert config.run_id == "runner"  # the same on every machine


def test_torchrun_is_detected_from_its_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not started_by_external_launcher()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert started_by_external_launcher()


def _launch_problems(config: RunConfig) -> list:
    return launch_problems(config, resolve_hardware(config.hardware))


def test_launch_problems_are_reported_together():
    config = RunConfig(hardware=_hardware(kind=HardwareKind.multi_gpu, num_machines=2, machine_rank=2,
                                          start_method=StartMethod.fork, timeout_s=0))
    problems = {problem.key: problem.message for problem in _launch_problems(config)}
    assert problems["hardware.timeout_s"] == "is 0; it must be 1 or more"
    assert "0 .. num_machines-1 (0 .. 1)" in problems["hardware.machine_rank"]
    assert "meets at machine 0's address" in problems["hardware.main_process_ip"]
    assert "hardware.main_process_port" in problems
    assert "fork is unsafe once CUDA is initialised" in problems["hardware.start_method"]


def test_several_processes_need_a_multi_process_kind():
    (problem,) = _launch_problems(RunConfig(hardware=HardwareConfig(kind=HardwareKind.cpu, num_processes=4)))
    assert problem.key == "hardware" and "use hardware=multi_cpu or multi_gpu" in problem.message
    assert _launch_problems(RunConfig(hardware=_hardware(num_processes=4))) == []


def test_parallel_none_on_several_processes_is_refused():
    from runner.config import ParallelConfig, ParallelKind

    config = RunConfig(hardware=_hardware(num_processes=2), parallel=ParallelConfig(kind=ParallelKind.none))
    (problem,) = _launch_problems(config)
    assert problem.key == "parallel" and "would train separate copies of the model" in problem.message


def _raise(err):
    try:
        raise err
    except Exception as caught:
        return caught


def test_a_worker_failure_names_rank_step_and_trace():
    """The message ends with the end of the failed rank's traceback."""
    err = _raise(ValueError("boom"))
    mark_step(err, 5)
    failure = worker_failure(1, err)
    assert isinstance(failure, RankFailed)
    headline, *rest = str(failure).splitlines()
    assert headline == "rank 1 failed after 5 optimizer step(s): ValueError: boom"
    assert rest[0] == "  end of its traceback:" and rest[-1].strip() == "ValueError: boom"
    assert any("_raise" in line for line in rest)


def test_a_worker_user_error_keeps_just_its_message():
    failure = worker_failure(0, _raise(DataError("data: a split has no rows")))
    assert str(failure) == "data: a split has no rows (rank 0, before the first optimizer step)"


def test_a_broken_collective_means_a_lost_peer():
    failure = worker_failure(0, _raise(RuntimeError("[pair.cc:537] Read error: Connection reset by peer.")))
    assert isinstance(failure, PeerLost) and str(failure).startswith("rank 0 stopped before the first optimizer step")


def _failure(exitcode, message="", timestamp=100):
    def signal_name():
        return signal.Signals(-exitcode).name

    return SimpleNamespace(exitcode=exitcode, message=message, timestamp=timestamp, signal_name=signal_name)


def test_root_cause_prefers_the_rank_that_raised():
    """Over the ranks that lost it as a peer or were ended by a signal."""
    failures = {
        0: _failure(1, {"message": "PeerLost: rank 0 stopped after 2 optimizer step(s): it lost a peer"}, 99),
        1: _failure(1, {"message": "RankFailed: rank 1 failed after 2 optimizer step(s): ValueError: x"}, 100),
        2: _failure(-signal.SIGTERM, timestamp=98),
    }
    assert root_cause(failures) == RootCause(1, "rank 1 failed after 2 optimizer step(s): ValueError: x")


def test_root_cause_names_a_rank_killed_by_a_signal():
    failures = {0: _failure(-signal.SIGTERM, timestamp=5), 1: _failure(-signal.SIGKILL, timestamp=6)}
    assert root_cause(failures) == RootCause(1, "rank 1 was killed by signal SIGKILL (exit code -9)")


def test_a_relayed_hang_names_the_hung_rank():
    """Rank 0 gave up waiting and relayed the hang: the root cause named is rank 1, the one that hung."""
    hung = "rank 1 hung: it made no progress for 6 s (at optimizer step 2); rank 0 gave up waiting for it"
    failures = {0: _failure(-signal.SIGTERM, timestamp=5),
                1: _failure(1, {"message": f"RelayedFailure: [0] {hung}"}, 6)}
    assert root_cause(failures) == RootCause(1, hung)  # its log (runner_rank1.log) is the one worth reading


def test_a_joblib_loky_worker_falls_back_to_spawn(monkeypatch):
    calls = []
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    monkeypatch.setattr(multiprocessing, "set_start_method", lambda method, force=False: calls.append((method, force)))
    leave_loky_start_method()
    assert calls == [("spawn", True)]
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "fork")
    leave_loky_start_method()
    assert calls == [("spawn", True)]  # any other start method is left alone


def test_workers_get_omp_threads_unless_user_set(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with omp_threads_for_workers(3):
        assert os.environ["OMP_NUM_THREADS"] == "3"  # inherited by the workers started in here
    assert "OMP_NUM_THREADS" not in os.environ  # and gone again for whatever this process starts next
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    with omp_threads_for_workers(3):
        assert os.environ["OMP_NUM_THREADS"] == "8"


def test_a_checkpoint_refusal_is_not_helped_by_resume():
    """A rank that refuses its checkpoint is reported as a failure resume=auto cannot fix; other errors it can."""
    from runner.errors import ResumeRefused

    refusal = worker_failure(1, _raise(ResumeRefused("resume: ckpt was written by a run with 2 process(es)")))
    assert str(refusal) == "resume: ckpt was written by a run with 2 process(es) (rank 1, before the first optimizer step)"
    failures = {0: _failure(-signal.SIGTERM, timestamp=5),
                1: _failure(1, {"message": f"{type(refusal).__name__}: {refusal}"}, 5)}
    assert root_cause(failures) == RootCause(1, str(refusal), resume_helps=False)
    other = worker_failure(1, _raise(ConfigError("x", "is bad")))
    failures[1] = _failure(1, {"message": f"{type(other).__name__}: {other}"}, 5)
    assert root_cause(failures).resume_helps


def test_a_torchrun_restart_with_shared_store_warns(monkeypatch, caplog):
    from runner.launch.launcher import warn_shared_store_on_restart

    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with caplog.at_level("WARNING", logger="runner.launch.launcher"):
        warn_shared_store_on_restart()  # the first attempt: nothing to say
        assert caplog.text == ""
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
        warn_shared_store_on_restart()
        assert "torchrun restarted this group (restart 1) without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in caplog.text
        caplog.clear()
        monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        warn_shared_store_on_restart()
        assert caplog.text == ""


def test_a_restart_line_names_rank_error_and_step():
    """The failed rank, its error's last line and the step the restart continues from."""
    from runner.launch.failures import restart_line

    failed = worker_failure(1, _raise(ValueError("injected failure at training forward 6")))
    lost = "PeerLost: rank 0 stopped after 5 optimizer step(s): it lost a peer (RuntimeError: Connection closed by peer)"
    reports = {0: (lost, 10.0), 1: (f"{type(failed).__name__}: {failed}", 10.0)}
    assert restart_line(reports, 1, 2, 4) == (
        "runner: rank 1 failed: ValueError: injected failure at training forward 6; restart 1 of 2 from step 4")
    assert restart_line({}, 2, 2, None) == ("runner: a rank failed without a report (killed, or it crashed); restart 2 "
                                            "of 2 from the start (no checkpoint yet)")
    # Rank 1 killed by SIGKILL leaves no report; rank 0's lost peer is not named as the failure (it was).
    assert restart_line({0: (lost, 10.0)}, 1, 1, 100) == (
        "runner: a rank failed without a report (killed, or it crashed); rank(s) 0 then lost their peer; restart 1 "
        "of 1 from step 100")
