"""`python -m runner.launch.rank_exec LAUNCHER_PID COMMAND...`: how `python -m runner.launch` starts each rank of a user's
script. It asks Linux to kill this process when its launcher dies (PR_SET_PDEATHSIG, which survives exec), then
becomes `python COMMAND...` (os.execv: the same pid, no process in between). The runner's own workers get the same
(runner.distributed.dist.exit_with_parent); without it, `kill -9` of the launcher left the script's ranks training under PID
1, beside a requeued job writing the same outputs.

Imports nothing heavy: it runs once per rank before the script itself starts.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have `sig` sent to this process when its parent dies; False where prctl does not exist (not Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m runner.launch.rank_exec LAUNCHER_PID my_script.py [its arguments]", file=sys.stderr)
        raise SystemExit(2)
    launcher, command = int(argv[0]), argv[1:]
    # SIGKILL, as for the runner's own workers: a script's handler or a hung collective cannot hold it up.
    die_with_parent(signal.SIGKILL)
    if os.getppid() != launcher:  # the launcher died before prctl took effect: nobody would end this rank
        raise SystemExit(f"runner.launch.rank_exec: the launcher (pid {launcher}) is gone; not starting {command[0]}")
    os.execv(sys.executable, [sys.executable, *command])


if __name__ == "__main__":
    main(sys.argv[1:])
