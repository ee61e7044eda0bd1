"""Server-side apply's typed conversion of a built-in kind, after structured-merge-diff.

Before it merges an applied configuration, the API server converts it to a typed value of the
kind's schema (k8s.io/apimachinery `managedfields/internal/structuredmerge.go`, `Apply`:
"failed to create typed patch object (NAMESPACE/NAME; GROUP/VERSION, Kind=KIND): ERRORS").
structured-merge-diff (`typed/validate.go`) refuses there two things an ordinary create lets
through: two items with the same key in a list merged by key ("duplicate entries for key
[name=\"X\"]") and a field the schema does not declare ("field not declared in schema", the
first such field of each object only). The error is no meta/v1 Status, so the API server
answers 500 with its text and no reason (`responsewriters/status.go`, `ErrorToAPIStatus`).

The schemas are those kubernetes-validate ships for `VERSION`, the Kubernetes the test API
server reports. Modelled: objects (declared fields, or maps of one type), lists by their
`x-kubernetes-list-type` (map: keyed items, set: values, atomic: by index). Not modelled: a
scalar of the wrong type, a key field left out (structured-merge-diff takes its default).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

Json = dict[str, Any]
VERSION = "1.35"


@functools.cache
def _definitions() -> Json:
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    text = (folder / f"v{VERSION}.0-local-strict" / "_definitions.json").read_text()
    definitions: Json = json.loads(text)["$defs"]
    return definitions


@functools.cache
def _kinds() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> the definition of that kind."""
    return {
        (gvk["group"], gvk["version"], gvk["kind"]): name
        for name, definition in _definitions().items()
        for gvk in definition.get("x-kubernetes-group-version-kind", [])
    }


def _resolved(schema: Json) -> Json:
    reference = schema.get("$ref")
    if not isinstance(reference, str):
        return schema
    return _definitions()[reference.rsplit("/", 1)[-1]]


def _element(schema: Json, index: int, item: Any) -> str:
    """How structured-merge-diff names a list item in a path."""
    kind = schema.get("x-kubernetes-list-type", "atomic")
    if kind == "map" and isinstance(item, dict):
        keys = schema.get("x-kubernetes-list-map-keys", [])
        return "[" + ",".join(f"{key}={json.dumps(item[key])}" for key in keys if key in item) + "]"
    if kind == "set":
        return f"[={json.dumps(item)}]"
    return f"[{index}]"


def _errors(node: Any, schema: Json, path: str) -> list[str]:
    schema = _resolved(schema)
    if isinstance(node, dict):
        declared = schema.get("properties")
        values = schema.get("additionalProperties")
        errors: list[str] = []
        for key, value in node.items():
            if declared is not None and key in declared:
                errors += _errors(value, declared[key], f"{path}.{key}")
            elif isinstance(values, dict):
                errors += _errors(value, values, f"{path}.{key}")
            elif declared is not None:
                errors.append(f"{path}.{key}: field not declared in schema")
                break  # structured-merge-diff stops at the first one
        return errors
    if isinstance(node, list) and isinstance(schema.get("items"), dict):
        errors, seen = [], set()
        for index, item in enumerate(node):
            element = _element(schema, index, item)
            if element in seen:
                errors.append(f"{path}: duplicate entries for key {element}")
            seen.add(element)
            errors += _errors(item, schema["items"], path + element)
        return errors
    return []


def refusal(applied: Json) -> str | None:
    """The API server's answer to applying `applied` (a built-in kind), or None if it types."""
    api_version = str(applied.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    kind = str(applied.get("kind", ""))
    definition = _kinds().get((group, version, kind))
    if definition is None:
        return None
    errors = _errors(applied, _definitions()[definition], "")
    if not errors:
        return None
    metadata = applied.get("metadata") or {}
    where = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}; {group}/{version}"
    text = errors[0] if len(errors) == 1 else "errors:\n" + "\n".join(f"  {e}" for e in errors)
    return f"failed to create typed patch object ({where}, Kind={kind}): {text}"
