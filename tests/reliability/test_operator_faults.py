"""The operator converges through API errors, lost replies and dropped watches, then goes quiet.

What is promised (`operator_chaos.broken_promises`): the operator keeps running; once the
faults stop, every BatchedModel has exactly its rendered children (no duplicates, no
leftovers, one owner each) and a status that matches them (observedGeneration, Ready,
Degraded); then a resync of the unchanged models makes zero write requests, counted at the
API server, from anyone. The faults (409, 500, lost replies, dropped watches) must really
have happened.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.operator_chaos import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_operator_converges_through_api_faults_and_resyncs_without_writes(tmp_path: Path) -> None:
    plan = soaked(Plan(models=3, chaos_seconds=6.0, fault_rate=0.3))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    log = (tmp_path / "operator.log").read_text(errors="replace")[-3000:]
    assert not broken, f"{broken}\n{summary(report)}\n{log}"
