"""`carpool bench --url` where nothing listens (issue 11).

What is promised (`bench_unreachable.broken_promises`): the command exits non-zero within 5 s
(Python's start-up included) with one error line naming the URL, and prints no report.
"""

from __future__ import annotations

from reliability.bench_unreachable import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_bench_against_a_closed_port_stops_at_once_with_one_clear_error() -> None:
    plan = soaked(Plan())
    report = run(plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
