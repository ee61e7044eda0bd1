"""Structural-schema handling of custom resources, as the API server does it.

Defaulting (also of nulls, which are dropped where no default applies), pruning of unknown
fields, and validation of type (int-or-string too), bounds, enum, pattern, lengths, required
fields, `x-kubernetes-list-type` set and map keys, and CEL rules (`x-kubernetes-validations`,
evaluated with cel-python; a rule at the root sees `self.metadata.name`), which run unless a
type, required, enum or size error blocks them. Messages follow the API server's wording, so
that `carpool render` prints what `kubectl apply` would. The test API server uses the same
code, and the end-to-end tests run against a real API server too;
tests/operator/test_crd_rules.py breaks every rule of the CRD and compares the lines with the
API server's formats.

Unlike the API server: formats (`date-time`, `int64`) are not checked; CEL runs without the
Kubernetes extension libraries (strings, lists, regex beyond `matches`) or cost limits, and
without `messageExpression` or `reason` (the CRD uses neither; the test above fails if it
does); the lines that only say that other lines exist (`some validation rules were not
checked`, an int-or-string's `must validate at least one schema (anyOf)`) are left out.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
import re
from dataclasses import dataclass
from typing import Any

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from carpool_operator.names import CRD_FILE


@functools.cache
def crd() -> dict[str, Any]:
    # Shipped with the package (a link to crds/ in the repository).
    text = importlib.resources.files("carpool_operator").joinpath(CRD_FILE).read_text()
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


def quote(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return '"object"' if isinstance(value, dict) else '"array"'
    return str(value)


def apply_defaults(node: Any, schema: dict[str, Any]) -> Any:
    """Fill in `default`s, recursively (also inside defaulted values), as the API server does.

    A field left out, or null where the schema does not allow null, takes its default; a null
    with no default to take is dropped (apiextensions' PruneNonNullableNullsWithoutDefaults).
    Nulls inside a free-form part (x-kubernetes-preserve-unknown-fields) stay.
    """
    if isinstance(node, dict):
        properties: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in list(node):
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            # Kept: a null the schema allows, or one that takes a default below.
            kept = sub is None or sub.get("nullable") or "default" in sub
            if node[key] is None and not kept:
                del node[key]
        for key, sub in properties.items():
            absent = key not in node or (node[key] is None and not sub.get("nullable"))
            if absent and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                node[key] = apply_defaults(node[key], sub)
        if isinstance(extra, dict):
            for key in node:
                if key not in properties:
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
        allowed = ", ".join(quote(value) for value in schema["enum"])
        message = f"Unsupported value: {quote(node)}: supported values: {allowed}"
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
            causes.append(Cause(path, f"Invalid value: {quote(node)}: {message}"))
        if "maxLength" in schema and len(node) > schema["maxLength"]:
            message = f"may not be more than {schema['maxLength']} bytes"
            causes.append(Cause(path, f"Too long: {message}", "FieldValueTooLong"))
        if "pattern" in schema and not re.search(schema["pattern"], node):
            message = f"{path} in body should match '{schema['pattern']}'"
            causes.append(Cause(path, f"Invalid value: {quote(node)}: {message}"))
    return causes


def _go_value(value: Any) -> str:
    """A value as Go's %#v prints what the API server decoded from JSON."""
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(key)}:{_go_value(value[key])}" for key in sorted(value))
        return "map[string]interface {}{" + items + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_value(item) for item in value) + "}"
    if value is None:
        return "interface {}(nil)"
    return quote(value) if isinstance(value, str | bool) else str(value)


def _list_type_causes(node: list[Any], schema: dict[str, Any], path: str) -> list[Cause]:
    """`x-kubernetes-list-type`: a set's items, a map's keys (`x-kubernetes-list-map-keys`)
    appear once; each repeat is named once, at its first repeat (apiextensions' listtype)."""
    kind = schema.get("x-kubernetes-list-type")
    if kind not in ("set", "map"):
        return []
    keys: list[Any] = node
    if kind == "map":
        for index, item in enumerate(node):
            if item is not None and not isinstance(item, dict):
                message = f"Invalid value: {quote(item)}: must be an object for an array of "
                return [Cause(f"{path}[{index}]", message + "list-type map")]
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = []
        for item in node:
            present = item or {}
            keys.append({name: present[name] for name in names if name in present})
    seen: list[Any] = []
    reported: list[Any] = []
    causes: list[Cause] = []
    for index, key in enumerate(keys):
        if key not in seen:
            seen.append(key)
        elif key not in reported:
            reported.append(key)
            shown = _go_value(key) if isinstance(key, dict | list) or key is None else quote(key)
            message = f"Duplicate value: {shown}"
            causes.append(Cause(f"{path}[{index}]", message, "FieldValueDuplicate"))
    return causes


# Errors after which the API server does not run the CEL rules: the object has not the shape
# they were written for (apiextensions' hasBlockingErr).
_BLOCKING = {
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
}


def validate(node: Any, schema: dict[str, Any], path: str = "") -> list[Cause]:
    """Every violation of `schema` in `node`, as the API server's field causes.

    The schema's own checks first; then the CEL rules of every node, unless one of those
    errors is blocking (a wrong type, a missing field, a value not in the enum, too long, too
    many): then, as in the API server, no rule runs. (The API server adds a line saying so,
    `<nil>: ... some validation rules were not checked`; this leaves it out.)
    """
    causes = _check_structure(node, schema, path)
    if any(cause.reason in _BLOCKING for cause in causes):
        return causes
    return causes + _check_rules(node, schema, path)


def type_cause(path: str, node: Any, expected: str) -> Cause:
    found = json_type(node)
    message = f'{path} in body must be of type {expected}: "{found}"'
    return Cause(path, f'Invalid value: "{found}": {message}', "FieldValueTypeInvalid")


def _check_structure(node: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(node, int | str) and not isinstance(node, bool):
            return _check_scalar(node, schema, path)  # bounds for integers, pattern for strings
        return [type_cause(path, node, "integer,string")]
    expected = schema.get("type")
    if expected is not None and not _is(node, expected):
        if node is None and schema.get("nullable"):
            return []
        return [type_cause(path, node, expected)]
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
                causes += _check_structure(value, sub, f"{path}.{key}" if path else key)
    if isinstance(node, list):
        if "maxItems" in schema and len(node) > schema["maxItems"]:
            message = f"must have at most {schema['maxItems']} items"
            causes.append(Cause(path, f"Too many: {len(node)}: {message}", "FieldValueTooMany"))
        causes += _list_type_causes(node, schema, path)
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(node):
                causes += _check_structure(item, schema["items"], f"{path}[{index}]")
    return causes


def _check_rules(node: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    """The CEL rules (`x-kubernetes-validations`) of `schema` and of every node below it."""
    causes: list[Cause] = []
    for rule in schema.get("x-kubernetes-validations", []):
        if not cel_holds(rule["rule"], node):
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            # fieldPath (relative, e.g. ".model.device") points at the field to blame.
            where = ".".join(p for p in (path, rule.get("fieldPath", "").lstrip(".")) if p)
            value = f'"{schema.get("type", "")}"'  # the API server names the type, not the value
            causes.append(Cause(where or "<nil>", f"Invalid value: {value}: {message}"))
    if isinstance(node, dict):
        for key, value in node.items():
            sub = schema.get("properties", {}).get(key) or schema.get("additionalProperties")
            if isinstance(sub, dict) and not (path == "" and key == "metadata"):
                causes += _check_rules(value, sub, f"{path}.{key}" if path else key)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(node):
            causes += _check_rules(item, schema["items"], f"{path}[{index}]")
    return causes


def admit(body: dict[str, Any]) -> tuple[dict[str, Any], list[Cause]]:
    """A BatchedModel as the API server would store it, and why it would refuse it.

    Defaulted, and checked as under `fieldValidation=Strict` (kubectl's default): an unknown
    field is a problem too.
    """
    schema = model_schema()
    admitted = copy.deepcopy(body)
    if "status" in _storage_version().get("subresources", {}):
        admitted.pop("status", None)  # a create ignores it: only `/status` writes it
    admitted = apply_defaults(admitted, schema)
    unknown = prune(admitted, schema)
    causes = [Cause(path, "field not declared in schema", "FieldValueInvalid") for path in unknown]
    return admitted, causes + validate(admitted, schema)
