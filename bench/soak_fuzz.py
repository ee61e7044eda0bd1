"""Bad-input soak: hundreds of thousands of malformed requests while good ones flow.

The scenario of `tests/reliability/fuzz.py` with bigger numbers; every field of its `Plan`
is a flag (`--seed` changes the generated requests). Exit status 1 when a promise broke.

    python bench/soak_fuzz.py --examples 200000 --seed 7
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ for soak_common; tests/ for the scenarios (`reliability.*`) and `support.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reliability import fuzz
from soak_common import soak

if __name__ == "__main__":
    soak(__doc__.splitlines()[0], fuzz.Plan(), fuzz.run, fuzz.summary, fuzz.broken_promises)
