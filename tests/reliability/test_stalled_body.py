"""Bodies that stall: short of their Content-Length, or chunked and never ended.

What is promised (`stalled_body.broken_promises`): a short body gets 408 after the body
timeout, a trickling one 408 at its deadline (or either 503 once the bodies being read hold
--max-reading-bytes), each within its deadline plus 1 s and with its connection closed; the
sidecar's RSS grows by at most that cap plus 32 MiB; a good client meanwhile gets only
correct 200s or 503s with Retry-After, each within 1 s, and 200s after the stalls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.soaked import soaked
from reliability.stalled_body import Plan, broken_promises, run, summary

pytestmark = pytest.mark.serial


def test_stalled_bodies_are_answered_by_their_timeouts_in_bounded_memory(tmp_path: Path) -> None:
    plan = soaked(Plan(connections=8, sent_mib=16, body_timeout_s=1.0, timeout_ms=3_000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
