"""Overload soak: offered load at a multiple of capacity for minutes.

The scenario of `tests/reliability/overload.py` with bigger numbers; every field of its
`Plan` is a flag. Exit status 1 when a promise broke.

    python bench/soak_overload.py --seconds 300 --load-factor 3
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import overload
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        overload.Plan(),
        overload.run,
        overload.summary,
        overload.broken_promises,
    )
