"""Shutdown soak: SIGTERM under heavier load with a longer queue to drain.

The scenario of `tests/reliability/shutdown.py` with bigger numbers; every field of its
`Plan` is a flag. Exit status 1 when a promise broke.

    python bench/soak_shutdown.py --clients 256 --busy-s 10 --drain-seconds 30
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import shutdown
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        shutdown.Plan(),
        shutdown.run,
        shutdown.summary,
        shutdown.broken_promises,
    )
