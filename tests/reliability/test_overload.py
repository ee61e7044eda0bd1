"""Three times the model's capacity: a bounded queue, bounded memory, honest 429s.

What is promised (`overload.broken_promises`): only 200 and 429 answers; the excess refused
with a Retry-After of at least 1 s, and at most 2 s longer than a full queue takes to
drain, and counted as queue_full; the queue gauge never above
maxQueueItems; the sidecar's RSS within 32 MiB of its warm baseline; every accepted request
correct and within its deadline; the gauges back at zero afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.overload import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_overload_is_refused_with_429_and_the_rest_meets_its_deadline(tmp_path: Path) -> None:
    plan = soaked(Plan(seconds=4.0, load_factor=3.0, batch=4, infer_s=0.1, max_queue_items=32))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
