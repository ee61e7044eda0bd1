"""Schemathesis against the OpenAPI document the sidecar serves for itself.

What is promised (`api_schema.broken_promises`): for every operation of `GET /openapi.json`,
requests that follow the schema and requests that break it get no 5xx, only statuses the
document lists, with the content type, headers and body schema it declares; schema-breaking
requests are refused with a 4xx; the sidecar stays up with no unexpected error in its log.
"""

from __future__ import annotations

from pathlib import Path

from reliability.api_schema import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_the_sidecar_keeps_to_its_own_openapi_document(tmp_path: Path) -> None:
    plan = soaked(Plan(examples_per_operation=25))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, "\n".join([summary(report), *broken])
