"""`carpool bench` against a port where nothing listens: one clear error at once, no load.

One implementation for the quick test (`test_bench_unreachable.py`) and the soak (`bench/soak.py
bench_unreachable`). The console script runs as a user runs it, in a child process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from carpool.processes import free_port


@dataclass(frozen=True)
class Plan:
    runs: int = 2
    within_s: float = 5.0  # start of the command -> its exit, Python's start-up included
    concurrency: int = 64


@dataclass
class Run:
    exit_code: int
    seconds: float
    stdout: str
    stderr: str


@dataclass
class Report:
    runs: list[Run] = field(default_factory=list)


def run(plan: Plan) -> Report:
    report = Report()
    script = Path(sys.executable).parent / "carpool"
    for _ in range(plan.runs):
        url = f"http://127.0.0.1:{free_port()}"  # free: nothing listens there
        command = [str(script), "bench", "--url", url, "--concurrency", str(plan.concurrency)]
        command += ["--duration", "30", "--quiet"]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        seconds = time.monotonic() - started
        report.runs.append(Run(done.returncode, seconds, done.stdout, done.stderr))
    return report


def summary(report: Report) -> str:
    runs = ", ".join(f"exit {r.exit_code} after {r.seconds:.2f} s" for r in report.runs)
    last = report.runs[-1].stderr.strip() if report.runs else ""
    return f"{runs}; it said: {last!r}"


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    for one in report.runs:
        lines = one.stderr.strip().splitlines()
        if one.exit_code == 0:
            broken.append("exit code 0 for a server that is not there")
        if len(lines) != 1 or "no answer from http://127.0.0.1:" not in lines[0]:
            broken.append(f"not one clear error line: {one.stderr[-300:]!r}")
        if one.stdout.strip():
            broken.append(f"a report for a load never sent: {one.stdout[:300]!r}")
        if one.seconds >= plan.within_s:
            broken.append(f"took {one.seconds:.2f} s to give up")
    return broken
