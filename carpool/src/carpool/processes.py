"""Child processes: start one, wait until it is ready, stop it without hanging.

`carpool serve`, the benchmark harness and the tests all run carpool's servers as child
processes; they share this one way of doing it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

POLL_S = 0.05
# prctl(2) option: the signal a process gets when the thread that forked it exits.
PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: the child after fork should only call it, not load a library.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


class NotReady(RuntimeError):
    """The child exited, or the time ran out, before it said it was ready."""


def carpool_command(*args: str) -> list[str]:
    """`python -m carpool ARGS` with this interpreter."""
    return [sys.executable, "-m", "carpool", *args]


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child, with `extra` laid over it."""
    return {**os.environ, **(extra or {})}


# Ports free_port handed out: the kernel may offer a released port again at once, and a
# caller that asked for two ports (a server's and its probe's) must get two.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, and not one given before."""
    with _handed_out_lock:
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port: int = probe.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def spawn(
    command: Sequence[str],
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start `command` with `environment(env)`; its output goes to `log_path` when given.

    With `die_with_parent` (Linux), the child cannot outlive this process, even one killed
    by SIGKILL: no orphan keeps a port or a GPU.
    """
    if die_with_parent and _prctl is not None:
        popen["preexec_fn"] = functools.partial(_die_with, os.getpid())
    log: IO[bytes] | None = None
    if log_path is not None:
        log = log_path.open("wb")
        popen = {"stdout": log, "stderr": subprocess.STDOUT, **popen}
    try:
        return subprocess.Popen(list(command), env=environment(env), **popen)
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor


def _die_with(parent: int) -> None:
    """Runs in the child between fork and exec: SIGKILL from the kernel when `parent` dies.

    The "parent" of PR_SET_PDEATHSIG is the thread that forked the child, so a caller must
    spawn from a thread that outlives the child. If `parent` died before the prctl, the child
    was already re-parented and would never get the signal: it exits at once instead.
    """
    assert _prctl is not None
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(126)


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a GET of `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(
    children: Sequence[subprocess.Popen[Any]],
    ready: Callable[[], bool],
    timeout_s: float,
    what: str,
    stop: threading.Event | None = None,
) -> bool:
    """Poll `ready` until it is true (True), or until `stop` is set (False).

    Raises NotReady when one of `children` exits first or `timeout_s` passes.
    """
    deadline = time.monotonic() + timeout_s
    while not ready():
        for child in children:
            if child.poll() is not None:
                raise NotReady(f"{what} exited {child.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise NotReady(f"{what} not ready after {timeout_s:g} s")
        if (stop or threading.Event()).wait(POLL_S):
            return False
    return True


def stop(process: subprocess.Popen[Any], timeout_s: float = 10.0, group: bool = False) -> int:
    """SIGTERM, then SIGKILL if it lingers past `timeout_s`; returns the exit code.

    With `group`, both signals go to the child's process group (a child started with
    `start_new_session=True` leads one), so helpers it started go too.
    """

    def send(signum: signal.Signals) -> None:
        try:
            if group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
        except ProcessLookupError:
            pass  # gone already

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
    if group:
        send(signal.SIGKILL)  # whatever of the group outlived its leader
    return process.wait(timeout_s)
