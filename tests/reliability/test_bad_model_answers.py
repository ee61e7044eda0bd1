"""A model server that answers malformed results, then one that reports negative timings.

What is promised (`bad_model_answers.broken_promises`): a result whose status is no integer
is a malformed answer: every caller gets 502, the sidecar logs at most one line per batch
and no traceback; timings that cannot be are not learned: a lone caller, one request at a
time, waits over 0.1 s for at most one request in twenty.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.bad_model_answers import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_a_model_servers_bad_answers_are_502_and_its_timings_are_not_believed(
    tmp_path: Path,
) -> None:
    plan = soaked(Plan(callers=8, seconds=2.0))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
