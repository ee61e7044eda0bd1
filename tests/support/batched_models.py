"""BatchedModels for tests that apply them, and the conditions the operator wrote on them."""

from __future__ import annotations

from typing import Any


def model(name: str, **spec: Any) -> dict[str, Any]:
    """A toy model on the CPU with half a core; `spec` keys replace or add top-level fields."""
    body: dict[str, Any] = {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy", "device": "cpu"}, "resources": {"cpu": "500m"}},
    }
    body["spec"].update(spec)
    return body


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type `kind`, or {} while there is none."""
    for item in body.get("status", {}).get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    return {}
