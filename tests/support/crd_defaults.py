"""A CRD's `default`s, checked as the API server checks them (its ValidateDefaults).

Each default must survive pruning unchanged (`must not have unknown fields`), must validate
against its own schema, and must pass the CEL rules of its schema and below. The default is
checked as written: the defaults of the fields inside it are not applied first, so a rule on
an object defaulted to `{}` that reads `self.x` fails with `no such key: x`, as on a real
server. Defaults under the root's metadata, apiVersion and kind are refused elsewhere
(crd_openapi) and skipped here; additionalProperties are not followed (defaults are forbidden
there for metadata, and the API server does not look).
"""

from __future__ import annotations

import copy
from typing import Any

from carpool_operator.schema import Cause, prune, validate
from support.crd_cel import evaluate
from support.kube_field import child, invalid, key

Schema = dict[str, Any]
_META_FIELDS = ("metadata", "kind", "apiVersion")


def _without_rules(schema: Schema) -> Schema:
    """The schema with its CEL rules left out: value validation alone."""
    bare: Schema = {k: v for k, v in schema.items() if k != "x-kubernetes-validations"}
    for word in ("properties", "patternProperties"):
        if isinstance(bare.get(word), dict):
            bare[word] = {name: _without_rules(sub) for name, sub in bare[word].items()}
    for word in ("items", "additionalProperties", "not"):
        if isinstance(bare.get(word), dict):
            bare[word] = _without_rules(bare[word])
    return bare


def _one(schema: Schema, path: str) -> list[Cause]:
    default = schema["default"]
    where = child(path, "default")
    pruned = copy.deepcopy(default)
    prune(pruned, schema, "default")  # a path, so that no field counts as the object's envelope
    if pruned != default:
        return [invalid(where, default, "must not have unknown fields")]
    causes = validate(copy.deepcopy(default), _without_rules(schema), where)
    return causes or evaluate(default, schema, where)


def _walk(schema: Schema, path: str, root: bool, inside_meta: bool) -> list[Cause]:
    resource = root or bool(schema.get("x-kubernetes-embedded-resource"))
    inside_meta = inside_meta and not resource
    causes: list[Cause] = []
    if schema.get("default") is not None and not inside_meta:
        causes += _one(schema, path)
    if isinstance(schema.get("items"), dict):
        causes += _walk(schema["items"], child(path, "items"), False, inside_meta)
    for name, sub in (schema.get("properties") or {}).items():
        meta = inside_meta or (resource and name in _META_FIELDS)
        causes += _walk(sub, key(child(path, "properties"), name), False, meta)
    return causes


def validate_defaults(schema: Schema, path: str) -> list[Cause]:
    """Every refused default in a CRD version's openAPIV3Schema (at `path`) and below."""
    return _walk(schema, path, root=True, inside_meta=False)
