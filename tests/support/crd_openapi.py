"""The API server's rules for each node of a CRD's schema (its OpenAPI schema validation).

Per node: a known `type`; no `default` under the root's metadata, apiVersion or kind (nor in
their additionalProperties); none of id, $ref, patternProperties, definitions, dependencies,
additionalItems, items as a list, `uniqueItems: true`; `properties` and `additionalProperties`
not both; `x-kubernetes-preserve-unknown-fields` true or absent; the list and map types
(`set` items atomic, `map` items objects keyed by scalar properties that are required or
defaulted and not nullable); and each `x-kubernetes-validations` entry: a rule, a message
without line breaks, a known reason, a `fieldPath` that resolves (see crd_field_path), and,
where the schema is otherwise sound, a rule and a messageExpression that compile (crd_cel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from carpool_operator.schema import Cause
from support.crd_cel import compile_errors
from support.crd_field_path import FieldPathError, resolve
from support.crd_structural import init_error, properties
from support.kube_field import child, forbidden, index, invalid, key, not_supported, required

Schema = dict[str, Any]
_TYPES = ["array", "boolean", "integer", "number", "object", "string"]
_REASONS = ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"]
_META_FIELDS = ("metadata", "kind", "apiVersion")
_NEWLINES = re.compile(r"[\n\r]+")


@dataclass(frozen=True)
class Scope:
    """Where in the schema a node sits, as far as the rules care."""

    allow_defaults: bool = True
    disallow_reason: str = ""
    inside_meta: bool = False

    def without_defaults(self, reason: str) -> Scope:
        return replace(self, allow_defaults=False, disallow_reason=reason)


@dataclass
class Found:
    """Schema errors first, then CEL errors, as the API server lists them."""

    schema: list[Cause] = field(default_factory=list)
    cel: list[Cause] = field(default_factory=list)

    def add(self, other: Found) -> None:
        self.schema += other.schema
        self.cel += other.cel


def _node(schema: Schema, path: str, scope: Scope) -> list[Cause]:
    """What is refused on one node whatever its children."""
    causes: list[Cause] = []
    kind = str(schema.get("type") or "")
    if kind and kind not in _TYPES:
        causes.append(not_supported(child(path, "type"), kind, _TYPES))
    if "default" in schema and not scope.allow_defaults:
        detail = " ".join(part for part in ("must not be set", scope.disallow_reason) if part)
        causes.append(forbidden(child(path, "default"), detail))
    for name, what in (
        ("id", "id"),
        ("additionalItems", "additionalItems"),
        ("patternProperties", "patternProperties"),
        ("definitions", "definitions"),
        ("dependencies", "dependencies"),
        ("$ref", "$ref"),
    ):
        if schema.get(name) not in (None, "", {}):
            causes.append(forbidden(child(path, name), f"{what} is not supported"))
    if kind == "null":
        detail = "type cannot be set to null, use nullable as an alternative"
        causes.append(forbidden(child(path, "type"), detail))
    if isinstance(schema.get("items"), list) and schema["items"]:
        detail = "items must be a schema object and not an array"
        causes.append(forbidden(child(path, "items"), detail))
    if scope.inside_meta and schema.get("x-kubernetes-embedded-resource"):
        detail = "must not be used inside of resource meta"
        causes.append(forbidden(child(path, "x-kubernetes-embedded-resource"), detail))
    return causes


def _list_and_map_types(schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    kind = str(schema.get("type") or "")
    map_type = schema.get("x-kubernetes-map-type")
    list_type = schema.get("x-kubernetes-list-type")
    keys: list[str] = schema.get("x-kubernetes-list-map-keys") or []
    items = schema.get("items")
    item = items if isinstance(items, dict) else None
    if map_type is not None and kind != "object":
        detail = "must be object if x-kubernetes-map-type is specified"
        where = child(path, "type")
        causes.append(invalid(where, kind, detail) if kind else required(where, detail))
    if map_type is not None and map_type not in ("atomic", "granular"):
        where = child(path, "x-kubernetes-map-type")
        causes.append(not_supported(where, map_type, ["atomic", "granular"]))
    if list_type is not None and kind != "array":
        detail = "must be array if x-kubernetes-list-type is specified"
        where = child(path, "type")
        causes.append(invalid(where, kind, detail) if kind else required(where, detail))
    elif list_type == "set" and item is not None:
        detail = "must be atomic as item of a list with x-kubernetes-list-type=set"
        inner_list = item.get("x-kubernetes-list-type")
        if item.get("type") == "array" and inner_list not in (None, "atomic"):
            causes.append(
                invalid(child(path, "items", "x-kubernetes-list-type"), inner_list, detail)
            )
        if item.get("type") == "object" and item.get("x-kubernetes-map-type") != "atomic":
            causes.append(
                invalid(child(path, "items", "x-kubernetes-map-type"), inner_list, detail)
            )
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        where = child(path, "x-kubernetes-list-type")
        causes.append(not_supported(where, list_type, ["atomic", "set", "map"]))
    if keys:
        detail = "must be map if x-kubernetes-list-map-keys is non-empty"
        where = child(path, "x-kubernetes-list-type")
        if list_type is None:
            causes.append(required(where, detail))
        elif list_type != "map":
            causes.append(invalid(where, list_type, detail))
    if list_type == "map":
        causes += _map_list(schema, path, keys)
    if list_type in ("set", "map") and item is not None:
        causes += _map_set_items(item, path, list_type, keys)
    return causes


def _map_list(schema: Schema, path: str, keys: list[str]) -> list[Cause]:
    causes: list[Cause] = []
    items = schema.get("items")
    if not keys:
        detail = "must not be empty if x-kubernetes-list-type is map"
        causes.append(required(child(path, "x-kubernetes-list-map-keys"), detail))
    if items is None:
        detail = "must have a schema if x-kubernetes-list-type is map"
        causes.append(required(child(path, "items"), detail))
    elif not isinstance(items, dict):
        detail = "must only have a single schema if x-kubernetes-list-type is map"
        causes.append(invalid(child(path, "items"), items, detail))
    elif items.get("type") != "object":
        detail = "must be object if parent array's x-kubernetes-list-type is map"
        causes.append(invalid(child(path, "items", "type"), items.get("type", ""), detail))
    else:
        seen: set[str] = set()
        for name in keys:
            declared = properties(items).get(name)
            if declared is None:
                detail = "entries must all be names of item properties"
                causes.append(invalid(child(path, "x-kubernetes-list-map-keys"), keys, detail))
            elif declared.get("type") in ("array", "object"):
                detail = "must be a scalar type if parent array's x-kubernetes-list-type is map"
                where = child(key(child(path, "items", "properties"), name), "type")
                causes.append(invalid(where, "object", detail))
            if name in seen:
                detail = "must not contain duplicate entries"
                causes.append(invalid(child(path, "x-kubernetes-list-map-keys"), keys, detail))
            seen.add(name)
    return causes


def _map_set_items(item: Schema, path: str, list_type: str, keys: list[str]) -> list[Cause]:
    causes: list[Cause] = []
    if item.get("nullable"):
        detail = f"cannot be nullable when x-kubernetes-list-type is {list_type}"
        causes.append(forbidden(child(path, "items", "nullable"), detail))
    if list_type != "map":
        return causes
    needed = set(item.get("required") or [])
    for name in keys:
        declared = properties(item).get(name)
        if declared is None:
            continue  # reported above
        where = key(child(path, "items", "properties"), name)
        if name not in needed and declared.get("default") is None:
            detail = (
                "this property is in x-kubernetes-list-map-keys, so it must have a default or "
                "be a required property"
            )
            causes.append(required(child(where, "default"), detail))
        if declared.get("nullable"):
            detail = "this property is in x-kubernetes-list-map-keys, so it cannot be nullable"
            causes.append(forbidden(child(where, "nullable"), detail))
    return causes


def rule_value(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule as the API server prints it in an error: its internal type, field by field."""
    return {
        "Rule": rule.get("rule", ""),
        "Message": rule.get("message", ""),
        "MessageExpression": rule.get("messageExpression", ""),
        "Reason": rule.get("reason"),
        "FieldPath": rule.get("fieldPath", ""),
        "OptionalOldSelf": rule.get("optionalOldSelf"),
    }


def path_valid(schema: Schema, field_path: str) -> bool:
    if init_error(schema):
        return True  # the API server gives up on such a schema without a word here
    try:
        resolve(field_path, schema)
    except FieldPathError:
        return False
    return True


def _rules(schema: Schema, path: str) -> list[Cause]:
    """Each x-kubernetes-validations entry, before any CEL is compiled."""
    causes: list[Cause] = []
    for number, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        where = index(child(path, "x-kubernetes-validations"), number)
        source = str(rule.get("rule", ""))
        message = str(rule.get("message", ""))
        expression = str(rule.get("messageExpression", ""))
        if not source.strip():
            causes.append(required(child(where, "rule"), "rule is not specified"))
        elif message and not message.strip():
            causes.append(
                invalid(child(where, "message"), message, "must be non-empty if specified")
            )
        elif _NEWLINES.search(message.strip()):
            causes.append(invalid(child(where, "message"), message, "must not contain line breaks"))
        elif _NEWLINES.search(source.strip()) and not message.strip():
            detail = "message must be specified if rule contains line breaks"
            causes.append(required(child(where, "message"), detail))
        if expression and not expression.strip():
            detail = "messageExpression must be non-empty if specified"
            causes.append(required(child(where, "messageExpression"), detail))
        reason = rule.get("reason")
        if reason is not None and reason not in _REASONS:
            causes.append(not_supported(child(where, "reason"), reason, _REASONS))
        field_path = str(rule.get("fieldPath", ""))
        if field_path and not field_path.strip():
            detail = "must be non-empty if specified"
            causes.append(invalid(child(where, "fieldPath"), field_path, detail))
        if _NEWLINES.search(field_path):
            detail = "must not contain line breaks"
            causes.append(invalid(child(where, "fieldPath"), field_path, detail))
        if field_path and not path_valid(schema, field_path):
            causes.append(invalid(child(where, "fieldPath"), field_path, "must be a valid path"))
    return causes


def _compiled(schema: Schema, path: str, root: bool) -> list[Cause]:
    """What the CEL compiler says of each rule and messageExpression."""
    causes: list[Cause] = []
    for number, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        where = index(child(path, "x-kubernetes-validations"), number)
        source = str(rule.get("rule", ""))
        if not source.strip():
            continue
        errors = compile_errors(source, schema, root)
        if errors:
            detail = "compilation failed: " + "\n".join(errors)
            causes.append(invalid(child(where, "rule"), rule_value(rule), detail))
            continue
        expression = str(rule.get("messageExpression", ""))
        if expression and (errors := compile_errors(expression, schema, root)):
            detail = "messageExpression compilation failed: " + "\n".join(errors)
            causes.append(invalid(child(where, "messageExpression"), rule_value(rule), detail))
    return causes


def walk(schema: Schema, path: str, scope: Scope, root: bool, cel: bool) -> Found:
    """Every rule above for `schema` and below; `cel`: compile rules (the schema is sound)."""
    found = Found(_node(schema, path, scope))
    if schema.get("uniqueItems") is True:
        detail = "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
        found.schema.append(forbidden(child(path, "uniqueItems"), detail))
    extra = schema.get("additionalProperties")
    if extra is not None:
        if properties(schema) and (extra is False or isinstance(extra, dict)):
            detail = "additionalProperties and properties are mutual exclusive"
            found.schema.append(forbidden(child(path, "additionalProperties"), detail))
        sub = scope
        if scope.inside_meta:
            sub = scope.without_defaults("inside additionalProperties applying to object metadata")
        if isinstance(extra, dict):
            found.add(walk(extra, child(path, "additionalProperties"), sub, False, cel))
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    for name, sub_schema in properties(schema).items():
        sub = scope
        if (root or embedded) and name in _META_FIELDS:
            sub = replace(sub, inside_meta=True)
            if root:
                sub = sub.without_defaults(f"in top-level {name}")
        found.add(walk(sub_schema, key(child(path, "properties"), name), sub, False, cel))
    if isinstance(schema.get("not"), dict):
        found.add(walk(schema["not"], child(path, "not"), scope, False, False))
    for word in ("allOf", "oneOf", "anyOf"):
        for number, clause in enumerate(schema.get(word) or []):
            found.add(walk(clause, index(child(path, word), number), scope, False, False))
    items = schema.get("items")
    if isinstance(items, dict):
        found.add(walk(items, child(path, "items"), scope, False, cel))
    elif isinstance(items, list):
        for number, clause in enumerate(items):
            found.add(walk(clause, index(child(path, "items"), number), scope, False, cel))
    if schema.get("x-kubernetes-preserve-unknown-fields") is False:
        where = child(path, "x-kubernetes-preserve-unknown-fields")
        found.schema.append(invalid(where, False, "must be true or undefined"))
    found.schema += _list_and_map_types(schema, path)
    found.schema += _rules(schema, path)
    if not found.schema and cel:
        found.cel += _compiled(schema, path, root)
    return found
