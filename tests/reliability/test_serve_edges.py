"""`carpool serve` on a port another server holds, and SIGTERM under load (#25).

What is promised (`serve_edges.*_broken_promises`): started on an HTTP or gRPC port that
another server holds, `carpool serve` exits 1 within 10 s with one line naming the port,
and never says ready; when the port is taken while its sidecar restarts (3 times), the
restarts back off, each delay twice the one before, and once the port is free the pair is
ready again within 15 s. On SIGTERM under load (new and kept-alive connections), every request sent
before the signal gets its correct 200, none is reset or refused, and `carpool serve` exits
0 within 10 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.serve_edges import (
    DrainPlan,
    PortPlan,
    drain_broken_promises,
    drain_summary,
    port_broken_promises,
    port_summary,
    run_drains,
    run_ports,
)
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_serve_owns_its_ports_or_says_which_is_taken(tmp_path: Path) -> None:
    plan = soaked(PortPlan())
    report = run_ports(tmp_path, plan)
    broken = port_broken_promises(report, plan)
    print(port_summary(report))
    assert not broken, f"{broken}\n{port_summary(report)}"


def test_serve_answers_every_request_sent_before_sigterm(tmp_path: Path) -> None:
    plan = soaked(DrainPlan())
    runs = run_drains(tmp_path, plan)
    broken = drain_broken_promises(runs, plan)
    print(drain_summary(runs))
    assert not broken, f"{broken[:10]}\n{drain_summary(runs)}"
