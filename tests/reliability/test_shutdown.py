"""SIGTERM under load, as in a rollout: not ready at once, nothing sent is lost, exit in time.

What is promised (`shutdown.broken_promises`): readiness 503 within 0.25 s of the SIGTERM
and never back; clients with new and with keep-alive connections that go on sending for a
while after it (as a load balancer does) get every answer, 200 and correct, none reset;
every request queued at the signal answered; exit code 0 after the drain delay and within
it plus --drain-seconds. The soak repeats it: `bench/soak.py shutdown --runs 10`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.shutdown import Plan, broken_promises, run, summary
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_sigterm_under_load_answers_everything_accepted(tmp_path: Path) -> None:
    plan = soaked(Plan(clients=32, busy_s=1.0, drain_delay_s=1.0, lb_lag_s=0.5, runs=1))
    reports = run(tmp_path, plan)
    broken = broken_promises(reports, plan)
    print(summary(reports))
    assert not broken, f"{broken[:10]}\n{summary(reports)}"
