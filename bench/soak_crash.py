"""Crash soak: clients while the model server is SIGKILLed and restarted, again and again.

The scenario of `tests/reliability/crash.py` with bigger numbers; every field of its
`Plan` is a flag. Exit status 1 when a promise broke.

    python bench/soak_crash.py --clients 32 --restarts 30 --up-seconds 10
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import crash
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        crash.Plan(),
        crash.run,
        crash.summary,
        crash.broken_promises,
    )
