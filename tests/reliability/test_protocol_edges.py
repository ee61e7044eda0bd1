"""Protocol edges: `GET /` is KServe v1's liveness, text models take [n] as well as [n, 1],
and a deadline that passes before queueing is reported without "-0 ms".

What is promised (`protocol_edges.broken_promises`): `{"status": "alive"}` at `/`; the text
model answers [n] text over v2 and v1 correctly; the short deadline gets 504 with a message
that names the deadline and never says "-0"; every answer within 1 s.
"""

from __future__ import annotations

from pathlib import Path

from reliability.protocol_edges import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_protocol_edges_meet_what_kserve_and_triton_clients_expect(tmp_path: Path) -> None:
    plan = soaked(Plan(rounds=3))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
