"""`carpool infer` killed part way and resumed, and pointed at files that are not its own (#25).

What is promised (`infer_resume.broken_promises`): each run after a SIGKILL keeps every whole
answer line the runs before it wrote; the finished output holds every index once, in
order, with the right answer for each; given its input, another input's output or
a file of notes as --output, it exits 1 with one line and leaves the file as it was.
"""

from __future__ import annotations

from pathlib import Path

from reliability.infer_resume import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_infer_resumes_its_own_runs_and_touches_nothing_else(tmp_path: Path) -> None:
    plan = soaked(Plan())
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
