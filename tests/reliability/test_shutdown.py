"""SIGTERM under load: readiness drops first, everything accepted is answered, exit in time.

What is promised (`shutdown.broken_promises`): exit code 0 within --drain-seconds; every
request queued at the signal answered 200, correctly; later requests refused with 503
"shutting down", or finding the port closed, never cut off once accepted; readiness turns
503 while answers are still going out, and never back to 200.
"""

from __future__ import annotations

from pathlib import Path

from reliability.shutdown import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_sigterm_under_load_answers_everything_accepted(tmp_path: Path) -> None:
    plan = soaked(Plan(clients=32, busy_s=1.0, infer_s=0.1, batch=4, drain_seconds=10.0))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken[:10]}\n{summary(report)}"
