"""API schema soak: schemathesis with many more cases per operation of /openapi.json.

The scenario of `tests/reliability/api_schema.py` with bigger numbers; every field of its
`Plan` is a flag (`--seed` changes the generated requests). Exit status 1 when a promise broke.

    python bench/soak_api_schema.py --examples-per-operation 2000 --seed 3
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import api_schema
from soak_common import soak

if __name__ == "__main__":
    soak(
        __doc__.splitlines()[0],
        api_schema.Plan(),
        api_schema.run,
        api_schema.summary,
        api_schema.broken_promises,
    )
