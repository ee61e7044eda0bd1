"""Operator soak: many BatchedModels through minutes of API faults and dropped watches.

The scenario of `tests/reliability/operator_chaos.py` with bigger numbers; every field of its
`Plan` is a flag. Exit status 1 when a promise broke.

    python bench/soak_operator.py --models 20 --chaos-seconds 120 --fault-rate 0.3
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import operator_chaos
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        operator_chaos.Plan(),
        operator_chaos.run,
        operator_chaos.summary,
        operator_chaos.broken_promises,
    )
