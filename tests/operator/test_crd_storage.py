"""The CRD's rules for weights.storageUri, as the API server applies them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from carpool_operator.schema import apply_defaults, validate

CRD = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "crds" / "batchedmodels.carpool.dev.yaml").read_text()
)
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def problems(weights: dict[str, Any]) -> list[tuple[str, str]]:
    body = {"metadata": {"name": "m"}, "spec": {"model": {"handler": "toy", "weights": weights}}}
    return [
        (c.field, c.message.split(": ")[-1]) for c in validate(apply_defaults(body, SCHEMA), SCHEMA)
    ]


@pytest.mark.parametrize(
    "uri",
    ["s3://models/m.pt", "gs://b/k/", "hf://org/repo@v1", "https://example.com/m.tar.gz"],
)
def test_storage_uris_of_each_store_are_accepted(uri: str) -> None:
    assert problems({"storageUri": uri, "secretName": "store", "mountPath": "/w"}) == []


def test_storage_options_need_a_storage_uri() -> None:
    assert problems({"pvc": {"claimName": "w"}, "secretName": "store"}) == [
        ("spec.model.weights", "secretName and mountPath go with storageUri")
    ]
    assert problems({"storageUri": "s3://m/x", "uri": {"url": "https://example.com/m.pt"}}) == [
        ("spec.model.weights", "weights needs exactly one of image, pvc, uri or storageUri")
    ]
    (field, message) = problems({"storageUri": "ftp://example.com/m.pt"})[0]
    assert field == "spec.model.weights.storageUri" and "should match" in message
