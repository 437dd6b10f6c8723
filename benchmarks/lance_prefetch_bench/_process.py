"""Child processes that are always stopped: own process group, SIGTERM, then SIGKILL.

Every server and contender the benchmark starts goes through :class:`ManagedProcess`:

- it runs in a new session (its own process group), so a Ctrl-C in the terminal reaches only the
  benchmark, which then stops its children in order;
- on Linux it gets ``SIGTERM`` if the benchmark dies without cleaning up (``PR_SET_PDEATHSIG``);
- :meth:`ManagedProcess.stop` sends ``SIGTERM`` to the whole group, waits, then ``SIGKILL``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0
# On Linux, children go through this launcher: it asks the kernel to SIGTERM the child when the
# benchmark dies (PR_SET_PDEATHSIG, which survives exec), checks the benchmark is still there,
# then execs the command. (Not a preexec_fn: that makes Python fork, and Lance warns in forks.)
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class ManagedProcess:
    """A child process in its own process group, stopped with :meth:`stop` (also as a context manager).

    Args:
        args (Sequence[str]): the command.
        name (str): what to call it in messages, e.g. ``"nginx"``.
        stdout, stderr: as for :class:`subprocess.Popen`. Default: ``subprocess.DEVNULL``.
        env (dict, optional): the environment. Default: ``None``, this process's.
        stop_timeout_s (float): seconds to wait after ``SIGTERM`` before ``SIGKILL``, and again
            after it. Default: ``5.0``.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        name: str,
        stdout: int | IO[Any] | None = subprocess.DEVNULL,
        stderr: int | IO[Any] | None = subprocess.DEVNULL,
        env: dict[str, str] | None = None,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        command = list(args)
        if sys.platform == "linux":
            command = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        logger.debug("started %s (pid %d): %s", name, self.pid, " ".join(args))

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs."""
        return self.popen.poll()

    def stop(self) -> int | None:
        """Stop the process and its group: ``SIGTERM``, wait, ``SIGKILL``, wait. Idempotent.

        Returns:
            int | None: the exit code (negative: the signal), ``None`` if it could not be reaped.
        """
        self._signal_group(signal.SIGTERM)
        try:
            code = self.popen.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) ignored SIGTERM; killing it", self.name, self.pid)
            code = None
        # Also kill what is left of the group (grandchildren such as DataLoader workers).
        self._signal_group(signal.SIGKILL)
        if code is None:
            try:
                code = self.popen.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.error("%s (pid %d) could not be killed", self.name, self.pid)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        return code

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need a number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(
    port: int, process: ManagedProcess, *, timeout_s: float = 15.0, log: str | None = None
) -> None:
    """Wait until ``127.0.0.1:port`` accepts connections.

    Raises:
        RuntimeError: ``process`` exited first, or ``timeout_s`` seconds passed; the message holds
            the tail of the ``log`` file, if given.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        code = process.poll()
        if code is not None or time.monotonic() > deadline:
            why = f"exited with code {code}" if code is not None else f"not up after {timeout_s} s"
            raise RuntimeError(
                f"{process.name} did not start listening on 127.0.0.1:{port}: {why}{_tail(log)}"
            )
        time.sleep(0.05)


def _tail(path: str | None, chars: int = 1500) -> str:
    if path is None or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as log:
        text = log.read()[-chars:].strip()
    return f"; its log ({path}) ends with:\n{text}" if text else ""


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C while cleaning up (so a second Ctrl-C cannot leave servers running).

    Only in the main thread; elsewhere it does nothing.
    """
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
