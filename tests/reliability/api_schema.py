"""Schemathesis against the sidecar's own OpenAPI document (`GET /openapi.json`).

One implementation for the quick test (`test_api_schema.py`) and the soak
(`bench/soak.py api_schema`). For every operation of the document, schemathesis generates
requests that follow the schema (positive) and requests that break it (negative), sends them
to a live sidecar with the toy model, and checks each answer: never a 5xx, a status the
document lists, the content type and body schema it declares, schema-breaking requests
refused with a 4xx, undeclared methods refused with 405.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from support.sidecar import Sidecar, run_pair

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    unsupported_method,
]


# A request that breaks the schema may be refused before its body is judged: 408 when its
# deadline (a fuzzed timeout header) passes while the body is read, 413 when its declared
# shapes exceed the queue. Both are refusals, as documented for these operations.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                # schemathesis's defaults, plus 408 and 413
                "expected-statuses": [
                    *("400", "401", "403", "404", "405", "406", "408", "409", "413"),
                    *("415", "422", "428", "429", "5xx"),
                ]
            }
        }
    }
)


@dataclass(frozen=True)
class Plan:
    examples_per_operation: int = 40  # per generation mode, with and without the served name
    seed: int = 0


@dataclass
class Report:
    operations: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    sidecar_exit_code: int | None = None
    sidecar_log: str = ""


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    with run_pair(folder, "toy") as pair:
        sidecar = pair.sidecar
        schema = schemathesis.openapi.from_url(f"{sidecar.url}/openapi.json", config=CONFIG)
        # Half the cases address the served model, so that bodies and headers get explored
        # rather than answered 404 for an unknown name.
        served = {"name": sidecar.model, "version": "1"}
        for result in schema.get_all_operations():
            if not isinstance(result, Ok):
                report.failures.append(f"an operation the document cannot describe: {result}")
                continue
            operation = result.ok()
            report.operations.append(operation.label)
            fixed = {p.name: served[p.name] for p in operation.path_parameters if p.name in served}
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                for path_parameters in ({}, fixed):
                    strategy = operation.as_strategy(mode, path_parameters=path_parameters)
                    _exercise(sidecar, strategy, plan, report)
        report.sidecar_exit_code = sidecar.process.poll()
        report.sidecar_log = sidecar.log()
    return report


def _exercise(
    sidecar: Sidecar, strategy: SearchStrategy[Case[Any]], plan: Plan, report: Report
) -> None:
    @settings(
        max_examples=plan.examples_per_operation,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(plan.seed)
    @given(case=strategy)
    def one(case: Case[Any]) -> None:
        response = case.call(base_url=sidecar.url, timeout=30)
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as failures:
            label = case.operation.label
            report.failures += [f"{label}: {failure}"[:2000] for failure in failures.exceptions]

    # A negative case of an operation with nothing to break (no parameters, no body) cannot
    # be generated.
    with contextlib.suppress(Unsatisfiable):
        one()


def summary(report: Report) -> str:
    return (
        f"{len(report.operations)} operations, {sum(report.statuses.values())} requests: "
        f"{dict(sorted(report.statuses.items()))}; {len(report.failures)} failed checks"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = list(dict.fromkeys(report.failures))[:20]
    if len(report.operations) < 10:
        broken.append(f"only {len(report.operations)} operations in the document")
    if report.sidecar_exit_code is not None:
        broken.append(f"the sidecar exited with {report.sidecar_exit_code}")
    if "unexpected error" in report.sidecar_log:
        broken.append("an unexpected error in the sidecar log")
    return broken
