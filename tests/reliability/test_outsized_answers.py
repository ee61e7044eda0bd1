"""Small requests for huge answers: an output asked for thousands of times, or answers over
the limits, over REST and gRPC, beside a good caller.

What is promised (`outsized_answers.broken_promises`): a repeated output is refused (400,
INVALID_ARGUMENT), an answer over --max-answer-bytes 413 and one over the gRPC message limit
RESOURCE_EXHAUSTED, each within 1 s and before the model runs any of its items; the good
client gets only correct 200s; the sidecar's RSS grows by less than 32 MiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.outsized_answers import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_an_answer_is_bounded_before_it_is_built(tmp_path: Path) -> None:
    plan = soaked(Plan(rounds=3, rows=1000, copies=5000))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
