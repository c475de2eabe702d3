"""Stop signals: recorded by the handler, honoured after an optimizer step, agreed on by every rank at the same
step; a signal before training starts ends the run at once."""

from __future__ import annotations

import os
import signal

import pytest

from runner.errors import Preempted
from runner.distributed.signals import StopSignals, stop_during_startup

import dist_helpers
from test_dist import _launch_two


def test_only_configured_signals_are_recorded():
    with StopSignals(["SIGUSR1"]) as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested() and stop.name == "SIGUSR1"
    # Once stopping, a repeated signal must not kill the process while it exits: it is ignored from here on.
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_under_submitit_sigusr2_also_stops_the_run(monkeypatch):
    """SIGUSR2 is submitit's requeue signal."""
    from runner.distributed.signals import stop_signals

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    monkeypatch.delenv("SUBMITIT_LOCAL_JOB_ID", raising=False)
    assert stop_signals(["SIGTERM", "SIGUSR1"]) == [signal.SIGTERM, signal.SIGUSR1]
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert stop_signals(["SIGTERM", "SIGUSR1"]) == [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2]
    assert stop_signals([]) == []  # the user asked for every signal's default behaviour
    with StopSignals(["SIGTERM"]) as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.requested() and stop.name == "SIGUSR2"
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_a_stop_on_submitits_signal_is_handed_to_submitits_handler(monkeypatch):
    """submitit's SIGUSR2 handler requeues the job. The runner's stop handler displaces it, saves, and then calls
    it: without that a trial stopped near its time limit exited 75, nothing requeued it, and the sweep waited
    forever. The requeued job (SLURM_RESTART_COUNT > 0) continues from its checkpoint (tests/slurm, part d)."""
    from runner.distributed import signals
    from runner.distributed.dist import requeued_by_submitit

    calls = []

    def checkpoint_and_try_requeue(signum, frame):  # what submitit installs, named by its module
        calls.append(signum)

    checkpoint_and_try_requeue.__module__ = "submitit.core.job_environment"
    monkeypatch.setattr(signals, "_submitit_requeue", None)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    previous = signal.signal(signal.SIGUSR2, checkpoint_and_try_requeue)
    try:
        with StopSignals(["SIGTERM"]) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.requested() and calls == []  # the runner's handler took it: the run saves first
        assert signals.submitit_takes_over("SIGUSR2") and not signals.submitit_takes_over("SIGTERM")
        signals.hand_over_to_submitit("SIGTERM")
        assert calls == []
        signals.hand_over_to_submitit("SIGUSR2")
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert not requeued_by_submitit()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert requeued_by_submitit()
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    assert not requeued_by_submitit()  # a plain sbatch --requeue job continues only with resume=auto


def test_unsignalled_exit_restores_handlers():
    """Without a signal, the previous handlers come back."""
    before = signal.getsignal(signal.SIGUSR1)
    with StopSignals(["SIGUSR1"]) as stop:
        assert not stop.requested()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_signal_in_start_up_ends_the_run_at_once():
    """The error says nothing was trained or saved."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match="stopped by SIGTERM before training started; nothing was trained or saved"):
        with stop_during_startup():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler raises at the next bytecode
                pass
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("signal_rank", [0, 1])
def test_ranks_stop_together_one_step_after_signal(signal_rank):
    """No per-step wait and no log cadence: the signal seen after step 3 on one rank stops every rank after 4."""
    results = _launch_two(dist_helpers.step_at_which_ranks_stop, signal_rank, 3)
    assert results == {0: 4, 1: 4}
