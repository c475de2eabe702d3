"""`python -m runner`'s first lines: a stop signal before the config is composed ends the run with exit 75 and
the README's "nothing was trained" line, not with death by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, run_dirs_under


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler installed for `sig` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask & (1 << (sig - 1)))


CONSOLE_SCRIPT = Path(sys.executable).with_name("runner")  # `pip install` made it beside this interpreter


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("command, sig", [
    ([sys.executable, "-m", "runner"], signal.SIGTERM),
    ([sys.executable, "-m", "runner"], signal.SIGUSR1),
    ([str(CONSOLE_SCRIPT)], signal.SIGTERM),
], ids=["python -m runner, SIGTERM", "python -m runner, SIGUSR1", "runner, SIGTERM"])
def test_a_stop_signal_before_composing_exits_75(tmp_path, command, sig):
    """Signalled before the config is composed, the runner says nothing was trained or saved."""
    if not Path(command[0]).exists():
        pytest.skip(f"no console script at {command[0]} (the package is not installed in this environment)")
    proc = subprocess.Popen([*command, *TINY], cwd=tmp_path,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    # The handler is the entry's first act, while torch and Hydra still import (seconds): signal as soon as it is.
    while not _catches(proc.pid, sig):
        assert proc.poll() is None and time.monotonic() < deadline, "waited for the runner to install its handler"
        time.sleep(0.005)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr
    assert f"runner: stopped by {sig.name} before training started; nothing was trained or saved" in stderr
    assert "Traceback" not in stderr
    assert run_dirs_under(tmp_path) == []
