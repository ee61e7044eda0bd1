"""Floods of gRPC calls, and messages that are not protobuf, at a slow model.

What is promised (`grpc_flood.broken_promises`): clients see only OK, RESOURCE_EXHAUSTED
(always with retry-after), DEADLINE_EXCEEDED, and for a message that is no ModelInferRequest
INVALID_ARGUMENT (or RESOURCE_EXHAUSTED, refused before it was decoded), never UNKNOWN; the
sidecar counts every call once, and the 200s, 400s and 429s exactly as the clients saw
them; its log holds no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.grpc_flood import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_a_grpc_flood_is_refused_with_retry_after_and_counted_call_by_call(
    tmp_path: Path,
) -> None:
    plan = soaked(Plan(waves=2, calls=1500, deadline_s=1.0, junk=20))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
