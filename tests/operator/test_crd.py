"""The CRD itself, and the example BatchedModels checked against its schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from carpool.contract.batching import Batching
from carpool_operator import names
from carpool_operator.schema import apply_defaults, validate

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / names.CRD_FILE
CRD = yaml.safe_load(CRD_FILE.read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = Path(__file__).resolve().parent / "invalid"


def fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from fields(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from fields(schema["items"], f"{path}[]")


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(CRD, "1.35.0", strict=True)
    assert CRD["spec"]["names"]["shortNames"] == ["bm"]
    assert VERSION["subresources"] == {"status": {}}


def test_the_operator_watches_and_owns_by_the_names_the_crd_declares() -> None:
    spec = CRD["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        names.GROUP,
        names.KIND,
        names.PLURAL,
    )
    assert CRD["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    (storage,) = [version["name"] for version in spec["versions"] if version["storage"]]
    assert storage == names.VERSION


def test_every_spec_field_is_described_and_bounded() -> None:
    for path, sub in fields(SCHEMA["properties"]["spec"], "spec"):
        assert (
            "type" in sub
            or sub.get("x-kubernetes-preserve-unknown-fields")
            or sub.get("x-kubernetes-int-or-string")
        ), path
        if "tolerations[]" in path or "imagePullSecrets[]" in path or "env[]" in path:
            continue  # core/v1 types copied as they are
        assert sub.get("description"), f"{path} has no description"
        if sub.get("type") == "integer":
            assert "minimum" in sub and "maximum" in sub, f"{path} is unbounded"
        if sub.get("type") == "string":
            assert {"maxLength", "enum", "pattern"} & set(sub), f"{path} is unbounded"


def test_every_status_field_is_declared() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    assert {
        "observedGeneration", "replicas", "readyReplicas", "replicasReady", "url", "batching",
    } <= set(status)  # fmt: skip
    assert set(status["batching"]["properties"]) == set(Batching().as_file())
    condition = status["conditions"]["items"]["properties"]
    assert set(condition) == {
        "type", "status", "reason", "message", "observedGeneration", "lastTransitionTime",
    }  # fmt: skip


def test_printer_columns() -> None:
    columns = {column["name"]: column["jsonPath"] for column in VERSION["additionalPrinterColumns"]}
    assert columns == {
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Replicas": ".status.replicasReady",
        # The values in use, which the operator's defaults fill in where the spec has none.
        "MaxBatch": ".status.batching.maxBatchSize",
        "MaxWait": ".status.batching.maxWaitMs",
        "URL": ".status.url",
        "Age": ".metadata.creationTimestamp",
    }


def test_the_chart_ships_the_repository_crd() -> None:
    # Its spec.batching is written from the knobs: tests/contract/test_knobs.py.
    chart_copy = ROOT / "charts" / "carpool" / "files" / "crds" / CRD_FILE.name
    assert chart_copy.read_text() == CRD_FILE.read_text()


def test_batching_is_left_to_the_operator_defaults() -> None:
    """No server-side default, or the operator's (the chart's) defaults would never apply."""
    batching = SCHEMA["properties"]["spec"]["properties"]["batching"]
    body = apply_defaults({"spec": {"model": {"handler": "toy"}, "batching": {}}}, SCHEMA)
    assert body["spec"]["batching"] == {}
    body = apply_defaults({"spec": {"model": {"handler": "toy"}}}, SCHEMA)
    assert "batching" not in body["spec"]
    assert set(batching["properties"]) == set(Batching().as_file())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_match_the_schema(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    jsonschema.validate(body, SCHEMA)
    assert validate(apply_defaults(body, SCHEMA), SCHEMA) == []


def test_out_of_bounds_example_is_rejected() -> None:
    body = yaml.safe_load((INVALID / "out-of-bounds.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, SCHEMA)
    messages = [cause.message for cause in validate(apply_defaults(body, SCHEMA), SCHEMA)]
    assert any("greater than or equal to 0" in message for message in messages)
    assert any('Unsupported value: "fp64"' in message for message in messages)


@pytest.mark.parametrize(
    ("surge", "problem"),
    [
        (1001, "maxSurge in body should be less than or equal to 1000"),
        (-1, "maxSurge in body should be greater than or equal to 0"),
        ("half", "maxSurge in body should match '^[0-9]+%$'"),
    ],
)
def test_rollout_counts_and_percentages_are_bounded(surge: int | str, problem: str) -> None:
    """An int-or-string's bounds sit beside its bare anyOf: integers get minimum and maximum,
    strings the pattern."""

    def body(rollout: dict[str, Any]) -> dict[str, Any]:
        spec = {"model": {"handler": "toy"}, "rollout": rollout}
        return apply_defaults({"metadata": {"name": "surge"}, "spec": spec}, SCHEMA)

    assert validate(body({"maxSurge": 3, "maxUnavailable": "25%"}), SCHEMA) == []
    causes = validate(body({"maxSurge": surge}), SCHEMA)
    assert [(cause.field, cause.message.split(": ")[-1]) for cause in causes] == [
        ("spec.rollout.maxSurge", f"spec.rollout.{problem}")
    ]


def test_cel_rules_reject_what_plain_schema_cannot() -> None:
    body = yaml.safe_load((INVALID / "min-over-max.yaml").read_text())
    jsonschema.validate(body, SCHEMA)  # the bounds alone pass
    causes = validate(apply_defaults(body, SCHEMA), SCHEMA)
    assert [(c.field, c.message.split(": ")[-1]) for c in causes] == [
        ("spec.autoscaling", "minReplicas must not exceed maxReplicas")
    ]

    two_sources = {"pvc": {"claimName": "w"}, "uri": {"url": "https://example.com/m.pt"}}
    # A named object: the root's CEL rules run beside the spec's, as in the API server.
    body = {
        "metadata": {"name": "two-sources"},
        "spec": {"model": {"handler": "toy", "weights": two_sources}},
    }
    causes = validate(apply_defaults(body, SCHEMA), SCHEMA)
    assert [cause.field for cause in causes] == ["spec.model.weights"]
