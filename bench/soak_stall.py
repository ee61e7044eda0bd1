"""Stall soak: the model server hangs (SIGSTOP) and wakes (SIGCONT), again and again.

The scenario of `tests/reliability/stall.py` with bigger numbers; every field of its `Plan`
is a flag. Exit status 1 when a promise broke.

    python bench/soak_stall.py --stalls 30 --stall-seconds 5 --clients 32
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import stall
from soak_common import soak

if __name__ == "__main__":
    soak(__doc__.splitlines()[0], stall.Plan(), stall.run, stall.summary, stall.broken_promises)
