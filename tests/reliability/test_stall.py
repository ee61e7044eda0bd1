"""A model server that hangs (SIGSTOP) and wakes (SIGCONT): nobody waits past the deadline.

What is promised (`stall.broken_promises`): only correct 200s, 503s and 504s; every request
answered within its deadline (1 s here) plus 1 s; requests during a stall refused, not held;
service back within 5 s of SIGCONT.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.soaked import soaked
from reliability.stall import Plan, broken_promises, run, summary

pytestmark = pytest.mark.serial


def test_hung_model_server_costs_callers_no_more_than_their_deadline(tmp_path: Path) -> None:
    plan = soaked(Plan(clients=8, stalls=2, stall_seconds=3.0, between_s=2.0, timeout_ms=1_000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
