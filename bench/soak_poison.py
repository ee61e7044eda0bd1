"""Poison soak: many rounds of shared batches with poisoned callers among them.

The scenario of `tests/reliability/poison.py` with bigger numbers; every field of its `Plan`
is a flag. Exit status 1 when a promise broke.

    python bench/soak_poison.py --rounds 200 --callers 64 --poisoned-per-round 3
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import poison
from soak_common import soak

if __name__ == "__main__":
    soak(__doc__.splitlines()[0], poison.Plan(), poison.run, poison.summary, poison.broken_promises)
