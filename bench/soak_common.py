"""What every `bench/soak_*.py` shares: flags from a scenario's Plan, a run, a verdict.

The scenarios live in `tests/reliability/`, where the default test suite runs them small;
a soak script runs the same code with bigger numbers. Every field of the scenario's `Plan`
dataclass is a flag (`--restarts 50`). Logs of the processes stay in `--folder` (a new
temporary folder by default, printed at the end). Exit status 1 when a promise broke.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PlanT = TypeVar("PlanT", bound="DataclassInstance")
ReportT = TypeVar("ReportT")


def soak(
    description: str,
    defaults: PlanT,
    run: Callable[[Path, PlanT], ReportT],
    summary: Callable[[ReportT], str],
    broken_promises: Callable[[ReportT, PlanT], list[str]],
) -> None:
    parser = argparse.ArgumentParser(description=description)
    for spec in dataclasses.fields(defaults):
        value = getattr(defaults, spec.name)
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--folder", type=Path, default=None, help="where process logs go")
    args = vars(parser.parse_args())
    folder: Path = args.pop("folder") or Path(tempfile.mkdtemp(prefix="carpool-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    plan = dataclasses.replace(defaults, **args)
    print(f"plan: {plan}", flush=True)
    started = time.monotonic()
    report = run(folder, plan)
    print(f"took {time.monotonic() - started:.1f}s; logs in {folder}")
    print(summary(report))
    broken = broken_promises(report, plan)
    for promise in broken:
        print(f"BROKEN: {promise}")
    print("verdict:", "broken promises" if broken else "every promise kept")
    sys.exit(1 if broken else 0)
