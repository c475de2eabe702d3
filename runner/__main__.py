"""`python -m runner`. The stop-signal handler comes first, before torch and Hydra are imported: a scheduler's
SIGTERM during those seconds ends the run with exit 75 and "nothing was trained", as docs/checkpoints.md promises.

The guard matters: workers started with the "spawn" method import this module, and must not re-run Hydra."""

import os
import sys

from runner.errors import BROKEN_PIPE_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted
from runner.distributed.signals import stop_from_process_start


def main(entry: str = "main") -> None:
    try:
        stop_from_process_start()  # inside: a signal may land between two of the handlers it installs
        from runner.commands import cli

        getattr(cli, entry)()
    except Preempted as stop:
        print(f"runner: {stop}", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT_CODE) from None
    except BrokenPipeError:
        # The reader of stdout left (`runner --help | head`): stop quietly, as a program ended by SIGPIPE does. What
        # is still buffered goes to /dev/null, or Python's flush at exit raises the same error again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(BROKEN_PIPE_EXIT_CODE) from None


def console_main() -> None:
    """The `runner` console script: the same first act, then cli.console_main."""
    main("console_main")


if __name__ == "__main__":
    main()
