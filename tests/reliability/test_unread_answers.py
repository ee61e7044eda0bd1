"""Callers who never read their answers, and a SIGTERM while one is hanging.

What is promised (`unread_answers.broken_promises`): each connection that stops reading is
closed by the sidecar (its answer dropped) once --body-timeout-seconds pass without progress,
so while they still read nothing the sidecar's RSS is back within 64 MiB of where it was
(its peak, each request's body, results and answer at once, at most six times the answers
plus 64 MiB); a good client meanwhile gets correct 200s; with one more slow reader hanging,
SIGTERM ends with exit 0 within the drain delay plus --drain-seconds (plus 1 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.soaked import soaked
from reliability.unread_answers import Plan, broken_promises, run, summary

pytestmark = pytest.mark.serial


def test_answers_nobody_reads_are_dropped_and_the_drain_ends_on_time(tmp_path: Path) -> None:
    plan = soaked(Plan(readers=8, elements=2_000_000, idle_s=1.0, drain_seconds=3.0))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report, plan))
    assert not broken, f"{broken}\n{summary(report, plan)}"
