"""`carpool.batch` around a function that hangs, exits or answers None, among good calls (#25).

What is promised (`batch_edges.broken_promises`), for an async and a sync function: every
good caller gets its exact answer within its deadline, though hung batches took the only
slot ahead of it; a caller whose batch hung gets DeadlineExceeded at its deadline, one
whose batch raised SystemExit FunctionAborted, one whose batch returned None
BadModelResponse, each from one call of the function, never split; afterwards the engine
answers, with nothing queued or in flight.
"""

from __future__ import annotations

import pytest
from reliability.batch_edges import Plan, broken_promises, run, summary
from reliability.soaked import soaked

# Its callers' bounds are fractions of a second: on a machine the rest of the suite loads, a
# stalled event loop would decide them.
pytestmark = pytest.mark.serial


def test_a_function_that_hangs_exits_or_answers_none_harms_no_other_caller() -> None:
    plan = soaked(Plan())
    reports = run(plan)
    broken = broken_promises(reports, plan)
    print(summary(reports))
    assert not broken, f"{broken[:10]}\n{summary(reports)}"
