"""32 clients while the model server is SIGKILLed and restarted: one answer each, none lost.

What is promised (`crash.broken_promises`): every request gets exactly one HTTP answer, a
correct 200 or a 503, and the sidecar counts the same answers; no 503 waits out the deadline;
after each restart service resumes within 5 s, without restarting the sidecar.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.crash import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_model_server_crashes_lose_no_request(tmp_path: Path) -> None:
    plan = soaked(Plan(clients=32, restarts=3, up_seconds=1.5, timeout_ms=10_000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
