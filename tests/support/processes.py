"""Process plumbing every test helper needs: a free port, and a stop that never hangs."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it lingers past `timeout_s`; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)
    return process.returncode
