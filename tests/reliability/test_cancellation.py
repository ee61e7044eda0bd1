"""Thousands of callers hanging up at random points: nothing hangs, nothing leaks.

What is promised (`cancellation.broken_promises`): callers who wait get their own correct
200 despite the churn; afterwards the queue and in-flight gauges are back at zero, the
disconnects are counted as 499, new requests succeed, the sidecar is alive with no traceback
in its log, and its RSS grew by less than 16 MiB over the second half of the callers (the
first half sets its high-water mark).
"""

from __future__ import annotations

from pathlib import Path

from reliability.cancellation import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_callers_who_hang_up_leave_no_trace(tmp_path: Path) -> None:
    plan = soaked(Plan(callers=2_000, concurrency=96))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
