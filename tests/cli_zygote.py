"""`python -m runner` for the tests without paying torch's import in every process: a zygote.

Two thirds of a small run's CPU time is importing torch, datasets and Hydra (`/usr/bin/time python -m runner
debug=fast`: 3.8 s of CPU, 2.5 s of it `python -c "import runner.commands.cli, datasets"`, on an idle 2-core
machine), and the suite is CPU-bound (both cores busy for its whole run). The standard library's forkserver preloads
modules too, but its children end with os._exit: no exit handlers, no finalization, which is where a run's last
writes and the gloo drain happen. The zygote is a Python that imports those once, then forks one child per run: the
child points its stdin, stdout and stderr at the caller's pipes, moves to the run's folder and environment, and runs
the runner exactly as `python -m runner ARGS` does (runpy, `__main__`, the folder first on sys.path), then exits as
a process does: exit handlers, interpreter finalization, exit status or the signal that killed it. Only the imports
came before the fork, and the runner's own modules are not among them (their module state stays per run).

What a fork cannot show stays a real process (conftest.run_cli decides): a run with Python flags, an environment
other than the zygote's (the libraries read some variables when imported), and everything started with Popen
(signals, kills, start-up). A zygote that cannot start or dies hands its calls back to subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# torch.utils.tensorboard: the default logger's writer, 0.17 s of each run's imports otherwise (boto3 among them).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "hydra", "omegaconf", "datasets", "torch.utils.tensorboard")
# Read when a run runs, not when a library is imported, so they may differ between the zygote and a run: pytest's
# own, the tests' helpers' RUNNER_TEST_*, OpenMP's KMP_* (set in the tests' process by a library they import;
# OpenMP reads them when its runtime starts, in the run: the zygote runs no torch operation), and TMPDIR (the
# tempfile module's choice is reset in each child).
RUNTIME_ONLY = ("PYTEST_CURRENT_TEST", "RUNNER_TEST_", "KMP_", "TMPDIR")
MESSAGE = 1 << 20


class Zygote:
    """The caller's side: one zygote process, one run at a time (a concurrent caller gets None: use subprocess)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        theirs.close()
        self.socket, self.lock = ours, threading.Lock()
        ours.settimeout(300)
        try:
            ready = ours.recv(16)
        except OSError:
            ready = b""
        if ready != b"ready":
            self.process.kill()
            ours.close()
            raise OSError("the zygote did not start")
        ours.settimeout(None)

    def serves(self, env: dict[str, str]) -> bool:
        keys = [key for key in env.keys() | self.env.keys() if not key.startswith(RUNTIME_ONLY)]
        return self.process.poll() is None and all(env.get(key) == self.env.get(key) for key in keys)

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float):
        """(returncode, stdout, stderr) of `python -m runner ARGV` in cwd, or None when busy."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            out_read, out_write = os.pipe()
            err_read, err_write = os.pipe()
            request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
            try:
                socket.send_fds(self.socket, [request], [out_write, err_write])
                reply = self.socket.recv(MESSAGE)
            except OSError:
                reply = b""
            finally:
                for fd in (out_write, err_write):
                    os.close(fd)
            if not reply:  # the zygote is gone: this run and the next in a new interpreter (serves() says no)
                for fd in (out_read, err_read):
                    os.close(fd)
                self.process.kill()
                return None
            pid = json.loads(reply)["pid"]
            outputs = [_Reader(out_read), _Reader(err_read)]
            self.socket.settimeout(timeout)
            try:
                reply = self.socket.recv(MESSAGE)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self.socket.settimeout(None)
                self.socket.recv(MESSAGE)
                raise subprocess.TimeoutExpired([sys.executable, "-m", "runner", *argv], timeout) from None
            finally:
                self.socket.settimeout(None)
            if not reply:
                raise OSError(f"the zygote ended while its run (pid {pid}) was running")
            status = json.loads(reply)["status"]
            stdout, stderr = (reader.text() for reader in outputs)
            return os.waitstatus_to_exitcode(status), stdout, stderr
        finally:
            self.lock.release()

    def close(self) -> None:
        self.socket.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _Reader(threading.Thread):
    """A pipe read to its end (every process holding it, the run's own children too, has closed it), decoded as
    subprocess.run(text=True) decodes: universal newlines."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.chunks = fd, []
        self.start()

    def run(self) -> None:
        with open(self.fd, "rb", closefd=True) as pipe:
            for chunk in iter(lambda: pipe.read1(1 << 16), b""):
                self.chunks.append(chunk)

    def text(self) -> str:
        self.join()
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _serve(channel: socket.socket) -> dict | None:
    """The zygote's loop: fork a child per request and report its pid, then its exit status. Returns None when the
    caller has gone (the zygote exits), and, in a forked child, the request it is to run."""
    while True:
        message, fds, _, _ = socket.recv_fds(channel, MESSAGE, 2)
        if not message:
            return None
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            channel.close()
            _become(request, fds)
            return request
        for fd in fds:
            os.close(fd)
        channel.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        channel.send(json.dumps({"status": status}).encode())


def _become(request: dict, fds: list[int]) -> None:
    """This forked child as a new `python -m runner` process would start: its streams, folder, environment, path."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    for target, fd in zip((0, 1, 2), (devnull, *fds)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # as a new process: temporary files where this run's TMPDIR says, not the zygote's
    sys.path[0] = os.getcwd()  # `python -m` puts the working folder first; the zygote had its own script's
    sys.argv = [sys.argv[0], *request["argv"]]  # runpy sets argv[0] to runner/__main__.py, as `python -m` does


if __name__ == "__main__":
    import importlib
    import runpy

    channel = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush(), sys.stderr.flush()
    channel.send(b"ready")
    if _serve(channel) is None:
        sys.exit(0)
    del channel
    runpy.run_module("runner", run_name="__main__", alter_sys=True)
