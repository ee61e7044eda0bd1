"""Structural-schema handling of custom resources, as the API server does it.

Defaulting, pruning of unknown fields, and validation of type, bounds, enum, pattern, lengths,
required fields and CEL rules (`x-kubernetes-validations`, evaluated with cel-python; a rule
at the root sees `self.metadata.name`). Messages follow the API server's wording, so that
`carpool render` prints what `kubectl apply` would. The test API server uses the same code,
and the end-to-end tests run against a real API server too.

Unlike the API server: formats (`date-time`, `int64`) are not checked, and CEL runs without
the Kubernetes extension libraries (strings, lists, regex beyond `matches`) or cost limits.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import re
from dataclasses import dataclass
from typing import Any

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

# The CRD, shipped with the package (a link to crds/ in the repository).
_CRD_FILE = "batchedmodels.carpool.dev.yaml"


@functools.cache
def crd() -> dict[str, Any]:
    text = importlib.resources.files("carpool_operator").joinpath(_CRD_FILE).read_text()
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def _storage_version() -> dict[str, Any]:
    (version,) = [v for v in crd()["spec"]["versions"] if v.get("storage")]
    return dict(version)


def served() -> tuple[str, str]:
    """The apiVersion and kind of the BatchedModels the CRD serves (its storage version)."""
    version = _storage_version()
    assert version.get("served"), "the storage version is not served"
    return f"{crd()['spec']['group']}/{version['name']}", str(crd()["spec"]["names"]["kind"])


def model_schema() -> dict[str, Any]:
    """The BatchedModel's openAPIV3Schema (the storage version's)."""
    schema: dict[str, Any] = _storage_version()["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def cel_holds(rule: str, node: Any) -> bool:
    """Whether a CEL rule holds with `self` bound to `node`; an error counts as a failure."""
    try:
        return bool(_program(rule).evaluate({"self": json_to_cel(node)}))
    except CELEvalError:
        return False


def json_type(value: Any) -> str:
    """The JSON type of a value: what the API server calls it in its messages."""
    if value is None:
        return "null"
    for name in ("boolean", "integer", "number", "string", "object", "array"):
        if _is(value, name):
            return name
    return type(value).__name__


def _is(value: Any, expected: str) -> bool:
    if isinstance(value, bool) and expected in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES[expected])


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


@dataclass(frozen=True)
class Cause:
    field: str
    message: str
    reason: str = "FieldValueInvalid"


def _quote(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return '"object"' if isinstance(value, dict) else '"array"'
    return str(value)


def apply_defaults(node: Any, schema: dict[str, Any]) -> Any:
    """Fill in `default`s for absent fields, recursively (also inside defaulted values)."""
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                node[key] = apply_defaults(node[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in node:
                node[key] = apply_defaults(node[key], extra)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in node]
    return node


def prune(node: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Drop fields the schema does not declare; return their paths."""
    dropped: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return dropped
    if isinstance(node, dict) and schema.get("type") == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in list(node):
            child = f"{path}.{key}" if path else key
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue  # the object's envelope is the API server's, never pruned
            if key in properties:
                dropped += prune(node[key], properties[key], child)
            elif isinstance(extra, dict):
                dropped += prune(node[key], extra, child)
            else:
                dropped.append(child)
                del node[key]
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(node):
            dropped += prune(item, schema["items"], f"{path}[{index}]")
    return dropped


def _check_scalar(node: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    if "enum" in schema and node not in schema["enum"]:
        allowed = ", ".join(_quote(value) for value in schema["enum"])
        message = f"Unsupported value: {_quote(node)}: supported values: {allowed}"
        causes.append(Cause(path, message, "FieldValueNotSupported"))
    if isinstance(node, int | float) and not isinstance(node, bool):
        if "minimum" in schema and node < schema["minimum"]:
            message = f"{path} in body should be greater than or equal to {schema['minimum']}"
            causes.append(Cause(path, f"Invalid value: {node}: {message}"))
        if "maximum" in schema and node > schema["maximum"]:
            message = f"{path} in body should be less than or equal to {schema['maximum']}"
            causes.append(Cause(path, f"Invalid value: {node}: {message}"))
    if isinstance(node, str):
        if "minLength" in schema and len(node) < schema["minLength"]:
            message = f"{path} in body should be at least {schema['minLength']} chars long"
            causes.append(Cause(path, f"Invalid value: {_quote(node)}: {message}"))
        if "maxLength" in schema and len(node) > schema["maxLength"]:
            message = f"may not be more than {schema['maxLength']} bytes"
            causes.append(Cause(path, f"Too long: {message}", "FieldValueTooLong"))
        if "pattern" in schema and not re.search(schema["pattern"], node):
            message = f"{path} in body should match '{schema['pattern']}'"
            causes.append(Cause(path, f"Invalid value: {_quote(node)}: {message}"))
    return causes


def validate(node: Any, schema: dict[str, Any], path: str = "") -> list[Cause]:
    """Every violation of `schema` in `node`, as the API server's field causes."""
    if schema.get("x-kubernetes-int-or-string") and isinstance(node, int | str):
        return _check_scalar(node, schema, path)  # bounds apply to integers, pattern to strings
    expected = schema.get("type")
    if expected is not None and not (
        isinstance(node, _JSON_TYPES[expected])
        and not (isinstance(node, bool) and expected in ("integer", "number"))
    ):
        if node is None and schema.get("nullable"):
            return []
        message = f"{path} in body must be of type {expected}: {_quote(type(node).__name__)}"
        return [Cause(path, f"Invalid value: {_quote(node)}: {message}", "FieldValueTypeInvalid")]
    causes = _check_scalar(node, schema, path)
    if isinstance(node, dict):
        for key in schema.get("required", []):
            if key not in node:
                child = f"{path}.{key}" if path else key
                causes.append(Cause(child, "Required value", "FieldValueRequired"))
        for key, value in node.items():
            if path == "" and key == "metadata":
                continue  # validated by the API server's own rules (and the root's CEL)
            sub = schema.get("properties", {}).get(key) or schema.get("additionalProperties")
            if isinstance(sub, dict):
                causes += validate(value, sub, f"{path}.{key}" if path else key)
    if isinstance(node, list):
        if "maxItems" in schema and len(node) > schema["maxItems"]:
            message = f"must have at most {schema['maxItems']} items"
            causes.append(Cause(path, f"Too many: {len(node)}: {message}", "FieldValueTooMany"))
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(node):
                causes += validate(item, schema["items"], f"{path}[{index}]")
    if not causes:
        for rule in schema.get("x-kubernetes-validations", []):
            if not cel_holds(rule["rule"], node):
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                # fieldPath (relative, e.g. ".model.device") points at the field to blame.
                where = ".".join(p for p in (path, rule.get("fieldPath", "").lstrip(".")) if p)
                causes.append(Cause(where or "<nil>", f"Invalid value: {_quote(node)}: {message}"))
    return causes


def admit(body: dict[str, Any]) -> tuple[dict[str, Any], list[Cause]]:
    """A BatchedModel as the API server would store it, and why it would refuse it.

    Defaulted, and checked as under `fieldValidation=Strict` (kubectl's default): an unknown
    field is a problem too.
    """
    schema = model_schema()
    admitted = apply_defaults(copy.deepcopy(body), schema)
    unknown = prune(admitted, schema)
    causes = [Cause(path, "field not declared in schema", "FieldValueInvalid") for path in unknown]
    return admitted, causes + validate(admitted, schema)
