"""`carpool.supervisor`: a child that exits is restarted, with back-off in a crash loop."""

from __future__ import annotations

import sys
import time

from carpool.supervisor import MAX_BACKOFF_S, Supervised, backoff_s

# Runs long enough that `tend` sees it running before it exits.
CRASHING = [sys.executable, "-c", "import sys, time; time.sleep(0.2); sys.exit(3)"]


def tend_until(child: Supervised, restarts: int, ready: bool, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while child.restarts < restarts:
        assert time.monotonic() < deadline, f"only {child.restarts} restarts"
        child.tend(time.monotonic(), lambda: ready)
        time.sleep(0.01)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.8]
    assert backoff_s(100) == MAX_BACKOFF_S


def test_a_crash_loop_backs_off_and_a_recovered_child_restarts_at_once() -> None:
    log: list[str] = []
    child = Supervised("crasher", CRASHING, log.append, stop_timeout_s=5)
    try:
        tend_until(child, restarts=3, ready=False)
        assert log[0].startswith("crasher exited with 3 after 0.")
        assert log[1].startswith("crasher restarted, pid ")
        assert [line.split("; ")[1] for line in log[::2]] == [
            "restarting in 0.1 s (restart 1)",
            "restarting in 0.2 s (restart 2)",
            "restarting in 0.4 s (restart 3)",
        ]
        # Once it served again, its next exit counts as a first one: the shortest delay.
        tend_until(child, restarts=4, ready=True)
        assert log[-2].endswith("restarting in 0.1 s (restart 4)")
    finally:
        child.stop()
