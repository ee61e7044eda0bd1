"""The CRD's free-form parts, checked against Kubernetes' own schemas.

The CRD keeps a few core/v1 types free-form (x-kubernetes-preserve-unknown-fields): they are
copied into the pod as written, and their schemas are Kubernetes', too large to repeat in the
CRD. The API server stores anything there, so a mistake would surface only when the Deployment
is refused. `carpool render` checks them against Kubernetes' strict OpenAPI schemas (types,
known fields, required fields) for `KUBERNETES_VERSION`, the oldest Kubernetes the chart
supports, and names the BatchedModel's fields. The API server's own rules beyond the schema
(an operator's values, label syntax) are not repeated.

The schemas come with kubernetes-validate (about 110 MB of them, one set per Kubernetes
version), an optional dependency: `carpool-operator[validate]`. `available()` says whether it
is installed; the operator itself never needs it.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import json
from collections.abc import Iterator
from typing import Any

from carpool_operator.schema import Cause, quote, type_cause
from carpool_operator.types import Manifest

# The oldest Kubernetes the chart supports (charts/carpool/Chart.yaml, kubeVersion): what is
# valid there is valid in every later version, and rendered manifests are valid there.
KUBERNETES_VERSION = "1.30"
EXTRA = "carpool-operator[validate]"

# Each free-form node of the CRD (`[]`: every item of a list) and the Kubernetes definition it
# holds. test_render_free_form.py holds the keys to the CRD.
FREE_FORM = {
    "spec.affinity": "io.k8s.api.core.v1.Affinity",
    "spec.model.env[].valueFrom": "io.k8s.api.core.v1.EnvVarSource",
}


def available() -> bool:
    """Whether kubernetes-validate, which holds the schemas, is installed."""
    try:
        return importlib.util.find_spec("kubernetes_validate") is not None
    except ValueError:  # in sys.modules as None: hidden on purpose
        return False


def _found(node: Any, tokens: list[str], path: str) -> Iterator[tuple[str, Any]]:
    if not tokens:
        yield path, node
        return
    token, rest = tokens[0], tokens[1:]
    if token.endswith("[]"):
        items = node.get(token[:-2]) if isinstance(node, dict) else None
        for index, item in enumerate(items if isinstance(items, list) else []):
            yield from _found(item, rest, f"{path}.{token[:-2]}[{index}]".lstrip("."))
    elif isinstance(node, dict) and token in node:
        yield from _found(node[token], rest, f"{path}.{token}".lstrip("."))


def parts(body: Manifest) -> list[tuple[str, str, Any]]:
    """The free-form parts a BatchedModel fills in: (pattern, field path, value)."""
    return [
        (pattern, path, value)
        for pattern in FREE_FORM
        for path, value in _found(body, pattern.split("."), "")
        if value is not None
    ]


@functools.cache
def _validator(definition: str) -> Any:
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    version = f"v{KUBERNETES_VERSION}.0-local-strict"
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / version
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions)
    )
    reference = {"$ref": f"{definitions['$id']}#/$defs/{definition}"}
    return Draft202012Validator(reference, registry=registry)


def _causes(path: str, error: Any) -> list[Cause]:
    """An error of jsonschema as the API server's field causes."""
    where = path + "".join(
        f"[{step}]" if isinstance(step, int) else f".{step}" for step in error.absolute_path
    )
    value = error.validator_value
    if error.validator == "type":
        names = [value] if isinstance(value, str) else [name for name in value if name != "null"]
        return [type_cause(where, error.instance, ",".join(names))]
    if error.validator == "additionalProperties":
        declared = error.schema.get("properties", {})
        return [
            Cause(f"{where}.{key}", "field not declared in schema")
            for key in error.instance
            if key not in declared
        ]
    if error.validator == "required":
        return [
            Cause(f"{where}.{key}", "Required value", "FieldValueRequired")
            for key in value
            if key not in error.instance
        ]
    if error.validator == "enum":
        allowed = ", ".join(quote(item) for item in value)
        message = f"Unsupported value: {quote(error.instance)}: supported values: {allowed}"
        return [Cause(where, message, "FieldValueNotSupported")]
    return [Cause(where, f"Invalid value: {quote(error.instance)}: {error.message}")]


def check(body: Manifest) -> list[Cause]:
    """What Kubernetes' schemas refuse in the free-form parts of a BatchedModel (admitted: its
    parts that are not objects the CRD's schema refuses already)."""
    causes: list[Cause] = []
    for pattern, path, value in parts(body):
        if not isinstance(value, dict):
            continue
        errors = _validator(FREE_FORM[pattern]).iter_errors(value)
        for error in sorted(errors, key=lambda error: [str(step) for step in error.absolute_path]):
            causes += _causes(path, error)
    return list(dict.fromkeys(causes))
