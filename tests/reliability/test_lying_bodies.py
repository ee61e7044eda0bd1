"""Bodies whose data outgrows the shape they declare, beside good callers.

What is promised (`lying_bodies.broken_promises`): each is refused (400; 413 for the rows
declared under an escaped key; INVALID_ARGUMENT over gRPC; or 503 while the bodies being read
hold --max-reading-bytes) within 1 s plus 2 s per 100 MiB of all of them, uploads included
(large bodies are counted one at a time); the good client gets only correct
200s or 503s with Retry-After, none slower than 1 s; /v2/health/live answers within
1 s throughout; the sidecar's RSS grows by at most the bodies plus three times the largest
(a copy or two of the one being counted) plus 64 MiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.lying_bodies import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_data_beyond_its_shape_is_refused_before_it_costs_a_neighbour(tmp_path: Path) -> None:
    plan = soaked(Plan(json_bodies=4, mib=16, rows=4_000_000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
