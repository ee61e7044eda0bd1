"""`carpool serve` behaves like a pod (issue 11).

What is promised (`serving.*_broken_promises`): after a SIGKILL of the model server or of the
sidecar, `carpool serve` restarts it, logs the restart and is ready again within 5 s, while
the sidecar answers 503 at once; after a SIGKILL of `carpool serve` itself no child process
and no socket folder remain (within 2 s). `carpool serve` runs from a folder outside the
repository, as the console script.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability.serving import (
    KilledPlan,
    RestartPlan,
    killed_broken_promises,
    killed_summary,
    restart_broken_promises,
    restart_summary,
    run_kills,
    run_restarts,
)
from reliability.soaked import soaked

pytestmark = pytest.mark.serial


def test_serve_restarts_a_killed_child_and_is_ready_within_5_s(tmp_path: Path) -> None:
    plan = soaked(RestartPlan())
    report = run_restarts(tmp_path, plan)
    broken = restart_broken_promises(report, plan)
    print(restart_summary(report))
    assert not broken, f"{broken}\n{restart_summary(report)}\n{report.log}"


def test_a_killed_serve_leaves_no_process_and_no_folder(tmp_path: Path) -> None:
    plan = soaked(KilledPlan())
    report = run_kills(tmp_path, plan)
    broken = killed_broken_promises(report, plan)
    print(killed_summary(report))
    assert not broken, f"{broken}\n{killed_summary(report)}"
