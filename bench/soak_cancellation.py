"""Cancellation soak: callers hanging up at random points, by the hundred thousand.

The scenario of `tests/reliability/cancellation.py` with bigger numbers; every field of its
`Plan` is a flag. Exit status 1 when a promise broke.

    python bench/soak_cancellation.py --callers 100000 --concurrency 256
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import cancellation
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        cancellation.Plan(),
        cancellation.run,
        cancellation.summary,
        cancellation.broken_promises,
    )
