"""Thousands of malformed requests against the live sidecar, while good requests flow.

What is promised (`fuzz.broken_promises`): every malformed request gets a 4xx with a JSON
`{"error"}` (or aiohttp's plain-text 400 for HTTP it cannot parse), never a 5xx, except the
toy model's own 500 for a NaN that binary data can carry and a 504 for a deadline the client
chose too short; good requests sent meanwhile all come back 200 and correct; the sidecar
stays up with no unexpected error in its log.
"""

from __future__ import annotations

from pathlib import Path

from reliability.fuzz import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_malformed_requests_get_4xx_and_good_ones_still_succeed(tmp_path: Path) -> None:
    plan = soaked(Plan(examples=2_000, good_clients=4))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, "\n".join([summary(report), *broken])
