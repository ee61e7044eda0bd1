"""A 4,000,000-item binary request (64,000,000 bytes, under the body limit) beside a good one.

What is promised (`oversized.broken_promises`): 413 within 100 ms of its last byte; the
sidecar's RSS grows by less than twice the body; a good request sent meanwhile gets its
correct 200 within its 2 s deadline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.oversized import Plan, broken_promises, run, summary
from reliability.soaked import soaked

# Its 100 ms bound is wall-clock: measured alone, not beside other tests.
pytestmark = pytest.mark.serial


def test_an_oversized_request_is_refused_at_once_and_harms_no_neighbour(tmp_path: Path) -> None:
    plan = soaked(Plan(items=4_000_000, rounds=1, good_timeout_ms=2_000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
