"""Whether a CRD's schema is structural, as the API server decides (its ValidateStructural).

A structural schema says the `type` of every node (an int-or-string or a node that preserves
unknown fields may leave it out), `items` for every array, no `additionalProperties` at the
root, and at the root `metadata` restricts at most `name` and `generateName`. Inside `anyOf`,
`allOf`, `oneOf` and `not` only value validations may appear: no type, default, description,
title, nullable, x-kubernetes-* extension, additionalProperties or metadata; the single
exception is an int-or-string's `anyOf: [{type: integer}, {type: string}]`, exactly so (also
as the first entry of an `allOf`). Every property such a clause restricts must be declared
outside it too. Errors come back sorted, as the API server sorts them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import re2

from carpool_operator.schema import Cause
from support.kube_field import child, forbidden, invalid, key, required

Schema = dict[str, Any]
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
_UNSUPPORTED = {
    "id": "id",
    "$schema": "schema",
    "$ref": "$ref",
    "patternProperties": "patternProperties",
    "dependencies": "dependencies",
    "additionalItems": "additionalItems",
    "definitions": "definitions",
}


class Level(Enum):
    ROOT = "root"
    ITEM = "item"
    FIELD = "field"


_EMPTY_TYPE = {
    Level.ROOT: "must not be empty at the root",
    Level.ITEM: "must not be empty for specified array items",
    Level.FIELD: "must not be empty for specified object fields",
}


def properties(schema: Schema) -> dict[str, Schema]:
    found: dict[str, Schema] = schema.get("properties") or {}
    return found


def _set(value: Any) -> bool:
    """Whether a field counts as given: Go's zero values (false, "", empty) do not."""
    if value is None or value is False:
        return False
    return not (isinstance(value, str | dict | list) and not value)


def init_error(schema: Schema) -> str | None:
    """Why the API server cannot even read `schema` as structural (NewStructural's error)."""
    for name, word in _UNSUPPORTED.items():
        if _set(schema.get(name)):
            return f"OpenAPIV3Schema '{word}' is not supported"
    if isinstance(schema.get("items"), list) and schema["items"]:
        return "OpenAPIV3Schema 'items' must be a schema, but is an array"
    if schema.get("x-kubernetes-preserve-unknown-fields") is False:
        return "internal error: 'x-kubernetes-preserve-unknown-fields' must be true or undefined"
    nested: list[Any] = [schema.get("items"), schema.get("not"), schema.get("additionalProperties")]
    nested += [*properties(schema).values(), *(schema.get("allOf") or [])]
    nested += [*(schema.get("anyOf") or []), *(schema.get("oneOf") or [])]
    for sub in nested:
        if isinstance(sub, dict) and (error := init_error(sub)):
            return error
    return None


def _pattern_error(pattern: str) -> str | None:
    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(pattern, options)
    except re2.error as error:
        detail = error.args[0].decode() if error.args else str(error)
        return f"must be a valid regular expression, but isn't: error parsing regexp: {detail}"
    return None


def _value_validation(
    schema: Schema, skip_any_of: bool, skip_first_all_of_any_of: bool, path: str
) -> list[Cause]:
    """The logic junctors of one node, each holding value validations alone."""
    causes: list[Cause] = []
    if not skip_any_of:
        for number, clause in enumerate(schema.get("anyOf") or []):
            causes += _nested(clause, False, f"{child(path, 'anyOf')}[{number}]")
    for number, clause in enumerate(schema.get("allOf") or []):
        skip = skip_first_all_of_any_of and number == 0
        causes += _nested(clause, skip, f"{child(path, 'allOf')}[{number}]")
    for number, clause in enumerate(schema.get("oneOf") or []):
        causes += _nested(clause, False, f"{child(path, 'oneOf')}[{number}]")
    if isinstance(schema.get("not"), dict):
        causes += _nested(schema["not"], False, child(path, "not"))
    if schema.get("pattern") and (error := _pattern_error(str(schema["pattern"]))):
        causes.append(invalid(child(path, "pattern"), schema["pattern"], error))
    return causes


_NOT_NESTED = (
    ("type", "must be empty to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)


def _nested(clause: Schema, skip_any_of: bool, path: str) -> list[Cause]:
    """A clause under anyOf, allOf, oneOf or not: value validations only."""
    causes = _value_validation(clause, skip_any_of, False, path)
    if isinstance(clause.get("items"), dict):
        causes += _nested(clause["items"], False, child(path, "items"))
    for name, sub in (clause.get("properties") or {}).items():
        causes += _nested(sub, False, key(child(path, "properties"), name))
    for name, detail in _NOT_NESTED:
        given = clause.get(name) is not None if name == "default" else _set(clause.get(name))
        if given:
            causes.append(forbidden(child(path, name), detail))
    extra = clause.get("additionalProperties")
    if extra is True or isinstance(extra, dict):
        detail = "must be undefined to be structural"
        causes.append(forbidden(child(path, "additionalProperties"), detail))
    if "metadata" in (clause.get("properties") or {}):
        detail = "must not be specified in a nested context"
        causes.append(forbidden(key(child(path, "properties"), "metadata"), detail))
    return causes


def _metadata(meta: Schema, check: bool, level: Level, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if check and meta.get("type") != "object":
        causes.append(invalid(child(path, "type"), meta.get("type", ""), "must be object"))
    if level is Level.ROOT:
        rest = {k: v for k, v in meta.items() if k not in ("type", "default") and _set(v)}
        if set(rest.get("properties") or {}) <= {"name", "generateName"}:
            rest.pop("properties", None)
        if rest:
            detail = (
                "must not specify anything other than name and generateName, but metadata is "
                "implicitly specified"
            )
            causes.append(forbidden(path, detail))
    return causes


def _invariants(schema: Schema, level: Level, path: str) -> list[Cause]:
    causes: list[Cause] = []
    kind = str(schema.get("type") or "")
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    items = schema.get("items")
    if kind == "array" and items is None:
        causes.append(required(child(path, "items"), "must be specified"))
    if isinstance(items, dict):
        causes += _invariants(items, Level.ITEM, child(path, "items"))
    for name, sub in properties(schema).items():
        causes += _invariants(sub, Level.FIELD, key(child(path, "properties"), name))
    extra = schema.get("additionalProperties")
    if extra is not None:
        if level is Level.ROOT:
            causes.append(
                forbidden(child(path, "additionalProperties"), "must not be used at the root")
            )
        if isinstance(extra, dict):
            causes += _invariants(extra, Level.FIELD, child(path, "additionalProperties"))
    if schema.get("x-kubernetes-int-or-string"):
        for name in ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource"):
            if schema.get(name):
                detail = "must be false if x-kubernetes-int-or-string is true"
                causes.append(invalid(child(path, name), True, detail))
    any_of = schema.get("anyOf")
    all_of = schema.get("allOf") or [{}]
    skip_any_of = any_of == _INT_OR_STRING
    skip_first = isinstance(all_of[0], dict) and all_of[0].get("anyOf") == _INT_OR_STRING
    causes += _value_validation(schema, skip_any_of, skip_first, path)
    if embedded and kind != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        if kind:
            causes.append(invalid(child(path, "type"), kind, detail))
        else:
            causes.append(required(child(path, "type"), detail))
    elif not kind and not (
        schema.get("x-kubernetes-int-or-string")
        or schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        causes.append(required(child(path, "type"), _EMPTY_TYPE[level]))
    if embedded and extra is not None:
        detail = "must not be used if x-kubernetes-embedded-resource is set"
        causes.append(forbidden(child(path, "additionalProperties"), detail))
    if level is Level.ROOT and kind and kind != "object":
        causes.append(invalid(child(path, "type"), kind, "must be object at the root"))
    check_metadata = level is Level.ROOT or embedded
    for name in ("kind", "apiVersion"):
        if check_metadata and name in properties(schema):
            found = str(properties(schema)[name].get("type") or "")
            if found != "string":
                field = child(key(child(path, "properties"), name), "type")
                causes.append(invalid(field, found, "must be string"))
    if "metadata" in properties(schema):
        meta_path = key(child(path, "properties"), "metadata")
        causes += _metadata(properties(schema)["metadata"], check_metadata, level, meta_path)
    preserves = schema.get("x-kubernetes-preserve-unknown-fields")
    if embedded and not preserves and not properties(schema):
        detail = (
            "must not be empty if x-kubernetes-embedded-resource is true without "
            "x-kubernetes-preserve-unknown-fields"
        )
        causes.append(required(child(path, "properties"), detail))
    return causes


def _clause_complete(
    clause: Schema, spine: Schema | None, spine_path: str, path: str
) -> list[Cause]:
    """A clause's properties and items must exist in the structural spine at the same place."""
    if spine is None:
        return [required(spine_path, f"because it is defined in {path}")]
    causes = _junctors_complete(clause, spine, spine_path, path)
    if isinstance(clause.get("items"), dict):
        items = spine.get("items") if isinstance(spine.get("items"), dict) else None
        causes += _clause_complete(
            clause["items"], items, child(spine_path, "items"), child(path, "items")
        )
    for name, sub in (clause.get("properties") or {}).items():
        declared = properties(spine).get(name)
        field = key(child(spine_path, "properties"), name)
        where = key(child(path, "properties"), name)
        if declared is None:
            causes.append(required(field, f"because it is defined in {where}"))
        else:
            causes += _clause_complete(sub, declared, field, where)
    return causes


def _junctors_complete(schema: Schema, spine: Schema, spine_path: str, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if isinstance(schema.get("not"), dict):
        causes += _clause_complete(schema["not"], spine, spine_path, child(path, "not"))
    for word in ("allOf", "anyOf", "oneOf"):
        for number, clause in enumerate(schema.get(word) or []):
            causes += _clause_complete(clause, spine, spine_path, f"{child(path, word)}[{number}]")
    return causes


def validate_structural(schema: Schema, path: str) -> list[Cause]:
    """Every way `schema` (a CRD version's openAPIV3Schema at `path`) is not structural."""
    causes = _invariants(schema, Level.ROOT, path)
    causes += _junctors_complete(schema, schema, path, path)
    return sorted(causes, key=lambda cause: f"{cause.field}: {cause.message}")
