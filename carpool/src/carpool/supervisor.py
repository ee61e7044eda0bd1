"""One child process kept running as a kubelet keeps a container: restarted with backoff.

`carpool serve` holds one `Supervised` per child and calls `tend` from its watch loop. A
child that exits on its own is started again after a delay that doubles with each exit in
a row (0.1 s, 0.2 s, 0.4 s ... at most 30 s), as a crash loop's does in a pod; once the
restarted child serves again (the caller's `ready`), the next exit starts from 0.1 s.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence

from carpool import processes

FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 30.0


def backoff_s(exits_in_a_row: int) -> float:
    """The delay before the restart that follows the `exits_in_a_row`-th quick exit."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * (1 << max(0, exits_in_a_row - 1)))


def exit_reason(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with {code}"


class Supervised:
    """A child process, started at once; call `tend` often, `stop` once at the end."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log: Callable[[str], None],
        stop_timeout_s: float,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log = log
        self.stop_timeout_s = stop_timeout_s
        self.restarts = 0
        self._quick_exits = 0
        self._restart_at: float | None = None
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        self._started_at = time.monotonic()
        # A new session: a terminal's Ctrl-C reaches only `carpool serve`, which stops the
        # children in order; the kernel kills them if `carpool serve` dies.
        return processes.spawn(self.command, start_new_session=True, die_with_parent=True)

    def tend(self, now: float, ready: Callable[[], bool]) -> None:
        """Notice an exit and schedule the restart; start the child when its time has come.

        `ready` says whether the child serves; it is asked only after a restart, until true.
        """
        if self._restart_at is None:
            code = self.process.poll()
            if code is None:
                if self._quick_exits and ready():
                    self._quick_exits = 0  # it recovered: the crash loop, if any, is over
                return
            self._quick_exits += 1
            delay = backoff_s(self._quick_exits)
            self._restart_at = now + delay
            self.log(
                f"{self.name} {exit_reason(code)} after {now - self._started_at:.1f} s; "
                f"restarting in {delay:g} s (restart {self.restarts + 1})"
            )
        if now >= self._restart_at:
            self._restart_at = None
            self.restarts += 1
            self.process = self._start()
            self.log(f"{self.name} restarted, pid {self.process.pid}")

    def stop(self) -> int:
        return processes.stop(self.process, self.stop_timeout_s)
