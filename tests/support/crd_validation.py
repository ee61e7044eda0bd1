"""A CustomResourceDefinition checked as the API server checks it before storing it.

`validate_crd` returns the field errors of apiextensions-apiserver's CRD validation for what
the test API server models: the name (`plural.group`), group, scope, names, versions (names,
exactly one storage version), printer columns, the root of a schema with a status subresource,
and each version's schema: structural (crd_structural), then its defaults (crd_defaults), then
every node's rules with the CEL rules compiled last (crd_openapi). Paths are the API server's:
a v1 CRD whose versions share one schema (a single version always does) is validated in the
internal form, so its errors name `spec.validation.openAPIV3Schema...` and
`spec.additionalPrinterColumns[i]`, not `spec.versions[i]...`.

Not modelled: conversion webhooks, the scale subresource's paths, selectable fields, CEL cost
limits, `oldSelf` rules, the protected-group approval annotation, and the relaxations an
update of an already invalid CRD gets (the test API server never stores an invalid one).
"""

from __future__ import annotations

import re
from typing import Any

from carpool_operator.schema import Cause
from support.crd_defaults import validate_defaults
from support.crd_openapi import Scope, walk
from support.crd_structural import init_error, validate_structural
from support.kube_field import child, forbidden, index, invalid, not_supported, required

Json = dict[str, Any]
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
_DNS_1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    f"for validation is '{_SUBDOMAIN}')"
)
_DNS_1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    f"'abc-123', regex used for validation is '{_DNS_1035}')"
)
_COLUMN_TYPES = "boolean,date,integer,number,string"
_COLUMN_FORMATS = "byte,date,date-time,double,float,int32,int64,password"
# The fields of the internal JSONSchemaProps in declaration order, and those allowed at the
# root of a schema whose version has a status subresource.
_ROOT_FIELDS = (
    ("id", "ID"), ("$schema", "Schema"), ("$ref", "Ref"), ("description", "Description"),
    ("type", "Type"), ("nullable", "Nullable"), ("format", "Format"), ("title", "Title"),
    ("default", "Default"), ("maximum", "Maximum"), ("exclusiveMaximum", "ExclusiveMaximum"),
    ("minimum", "Minimum"), ("exclusiveMinimum", "ExclusiveMinimum"),
    ("maxLength", "MaxLength"), ("minLength", "MinLength"), ("pattern", "Pattern"),
    ("maxItems", "MaxItems"), ("minItems", "MinItems"), ("uniqueItems", "UniqueItems"),
    ("multipleOf", "MultipleOf"), ("enum", "Enum"), ("maxProperties", "MaxProperties"),
    ("minProperties", "MinProperties"), ("required", "Required"), ("items", "Items"),
    ("allOf", "AllOf"), ("oneOf", "OneOf"), ("anyOf", "AnyOf"), ("not", "Not"),
    ("properties", "Properties"), ("additionalProperties", "AdditionalProperties"),
    ("patternProperties", "PatternProperties"), ("dependencies", "Dependencies"),
    ("additionalItems", "AdditionalItems"), ("definitions", "Definitions"),
    ("externalDocs", "ExternalDocs"), ("example", "Example"),
    ("x-kubernetes-preserve-unknown-fields", "XPreserveUnknownFields"),
    ("x-kubernetes-embedded-resource", "XEmbeddedResource"),
    ("x-kubernetes-int-or-string", "XIntOrString"),
    ("x-kubernetes-list-map-keys", "XListMapKeys"), ("x-kubernetes-list-type", "XListType"),
    ("x-kubernetes-map-type", "XMapType"), ("x-kubernetes-validations", "XValidations"),
)  # fmt: skip
_ALLOWED_AT_ROOT = [
    "Description", "Type", "Format", "Title", "Maximum", "ExclusiveMaximum", "Minimum",
    "ExclusiveMinimum", "MaxLength", "MinLength", "Pattern", "MaxItems", "MinItems",
    "UniqueItems", "MultipleOf", "Required", "Items", "Properties", "ExternalDocs", "Example",
    "XPreserveUnknownFields", "XValidations",
]  # fmt: skip


def _dns_1035(value: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not re.fullmatch(_DNS_1035, value):
        errors.append(_DNS_1035_MESSAGE)
    return errors


def _subdomain(value: str) -> list[str]:
    errors = ["must be no more than 253 characters"] if len(value) > 253 else []
    if not re.fullmatch(_SUBDOMAIN, value):
        errors.append(_SUBDOMAIN_MESSAGE)
    return errors


def _names(names: Json, path: str) -> list[Cause]:
    causes: list[Cause] = []
    for name in ("plural", "singular"):
        value = str(names.get(name) or "")
        if value and (errors := _dns_1035(value)):
            causes.append(invalid(child(path, name), value, ",".join(errors)))
    for name in ("kind", "listKind"):
        value = str(names.get(name) or "")
        if value and (errors := _dns_1035(value.lower())):
            detail = "may have mixed case, but should otherwise match: " + ",".join(errors)
            causes.append(invalid(child(path, name), value, detail))
    for number, short in enumerate(names.get("shortNames") or []):
        if errors := _dns_1035(str(short)):
            causes.append(
                invalid(index(child(path, "shortNames"), number), short, ",".join(errors))
            )
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        detail = "kind and listKind may not be the same"
        causes.append(invalid(child(path, "listKind"), names["listKind"], detail))
    for number, category in enumerate(names.get("categories") or []):
        if errors := _dns_1035(str(category)):
            causes.append(
                invalid(index(child(path, "categories"), number), category, ",".join(errors))
            )
    return causes


def _column(column: Json, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if not column.get("name"):
        causes.append(required(child(path, "name")))
    kind = str(column.get("type") or "")
    if not kind:
        causes.append(required(child(path, "type"), f"must be one of {_COLUMN_TYPES}"))
    elif kind not in _COLUMN_TYPES.split(","):
        causes.append(invalid(child(path, "type"), kind, f"must be one of {_COLUMN_TYPES}"))
    form = str(column.get("format") or "")
    if form and form not in _COLUMN_FORMATS.split(","):
        causes.append(invalid(child(path, "format"), form, f"must be one of {_COLUMN_FORMATS}"))
    json_path = str(column.get("jsonPath") or "")
    if not json_path:
        causes.append(required(child(path, "JSONPath")))
    elif not json_path.startswith("."):
        detail = "must be a simple json path starting with ."
        causes.append(invalid(child(path, "JSONPath"), json_path, detail))
    return causes


def _root_with_status(schema: Json, path: str) -> list[Cause]:
    """With a status subresource, the root may hold only what survives status extraction."""
    for name, go_name in _ROOT_FIELDS:
        value = schema.get(name)
        if value is None or value is False or value == "":
            continue
        if go_name == "Type":
            if value != "object":
                detail = (
                    'only "object" is allowed as the type at the root of the schema if the '
                    "status subresource is enabled"
                )
                return [invalid(child(path, "openAPIV3Schema.type"), value, detail)]
            continue
        if go_name not in _ALLOWED_AT_ROOT:
            allowed = " ".join(_ALLOWED_AT_ROOT)
            detail = (
                f"only [{allowed}] fields are allowed at the root of the schema if the status "
                "subresource is enabled"
            )
            return [invalid(child(path, "openAPIV3Schema"), schema, detail)]
    return []


def _validation(validation: Json | None, status: bool, path: str) -> list[Cause]:
    """One schema (a version's, or the shared one at spec.validation)."""
    schema = (validation or {}).get("openAPIV3Schema")
    if not isinstance(schema, dict):
        return []
    causes = _root_with_status(schema, path) if status else []
    if schema.get("nullable"):
        causes.append(
            forbidden(
                child(path, "openAPIV3Schema.nullable"), "nullable cannot be true at the root"
            )
        )
    root = child(path, "openAPIV3Schema")
    unreadable = init_error(schema)
    sound = False
    if unreadable is None:
        if structural := validate_structural(schema, root):
            causes += structural
        elif defaults := validate_defaults(schema, root):
            causes += defaults
        else:
            sound = True
    found = walk(schema, root, Scope(), root=True, cel=sound)
    causes += found.schema + found.cel
    if not causes and unreadable is not None:
        causes.append(invalid(root, "", unreadable))
    return causes


def _shared(versions: list[Json], name: str) -> bool:
    """Whether every version has the same `name` (then the API server moves it to spec)."""
    return bool(versions) and all(
        version.get(name) == versions[0].get(name) for version in versions
    )


def _versions(spec: Json, path: str) -> list[Cause]:
    causes: list[Cause] = []
    versions: list[Json] = spec.get("versions") or []
    shared_schema = _shared(versions, "schema")
    shared_columns = _shared(versions, "additionalPrinterColumns")
    if not (shared_schema and versions and versions[0].get("schema")):
        for number, version in enumerate(versions):
            if not (version.get("schema") or {}).get("openAPIV3Schema"):
                where = child(index(child(path, "versions"), number), "schema", "openAPIV3Schema")
                causes.append(required(where))
    for number, version in enumerate(versions):
        where = index(child(path, "versions"), number)
        name = str(version.get("name") or "")
        if errors := _dns_1035(name):
            causes.append(invalid(child(where, "name"), name, ",".join(errors)))
        status = "status" in (version.get("subresources") or {})
        if not shared_schema:
            causes += _validation(version.get("schema"), status, child(where, "schema"))
        if not shared_columns:
            for column_number, column in enumerate(version.get("additionalPrinterColumns") or []):
                column_path = index(child(where, "additionalPrinterColumns"), column_number)
                causes += _column(column, column_path)
    names = [version.get("name") for version in versions]
    if len(set(names)) != len(names):
        detail = "must contain unique version names"
        causes.append(invalid(child(path, "versions"), versions, detail))
    if sum(1 for version in versions if version.get("storage")) != 1:
        detail = "must have exactly one version marked as storage version"
        causes.append(invalid(child(path, "versions"), versions, detail))
    if versions and (errors := _dns_1035(str(versions[0].get("name") or ""))):
        first = str(versions[0].get("name") or "")
        causes.append(invalid(child(path, "version"), first, ",".join(errors)))
    return causes


def _spec(spec: Json, path: str) -> list[Cause]:
    causes: list[Cause] = []
    group = str(spec.get("group") or "")
    if not group:
        causes.append(required(child(path, "group")))
    elif errors := _subdomain(group):
        causes.append(invalid(child(path, "group"), group, ",".join(errors)))
    elif "." not in group:
        causes.append(
            invalid(child(path, "group"), group, "should be a domain with at least one dot")
        )
    scope = str(spec.get("scope") or "")
    if not scope:
        causes.append(required(child(path, "scope")))
    elif scope not in ("Cluster", "Namespaced"):
        causes.append(not_supported(child(path, "scope"), scope, ["Cluster", "Namespaced"]))
    causes += _versions(spec, path)
    names: Json = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind") or "").lower())
    if names.get("kind"):
        names.setdefault("listKind", f"{names['kind']}List")
    for name in ("plural", "singular", "kind", "listKind"):
        if not names.get(name):
            causes.append(required(child(path, "names", name)))
    causes += _names(names, child(path, "names"))
    versions: list[Json] = spec.get("versions") or []
    if _shared(versions, "schema"):
        status = any("status" in (version.get("subresources") or {}) for version in versions)
        causes += _validation(versions[0].get("schema"), status, child(path, "validation"))
    if _shared(versions, "additionalPrinterColumns"):
        for number, column in enumerate(versions[0].get("additionalPrinterColumns") or []):
            causes += _column(column, index(child(path, "additionalPrinterColumns"), number))
    if spec.get("preserveUnknownFields"):
        detail = (
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in "
            "spec.versions[*].schema instead"
        )
        causes.append(invalid(child(path, "preserveUnknownFields"), True, detail))
    return causes


def validate_crd(crd: Json) -> list[Cause]:
    """Every reason the API server would refuse to store `crd`, in the order it lists them."""
    spec: Json = crd.get("spec") or {}
    name = str((crd.get("metadata") or {}).get("name") or "")
    causes = [invalid("metadata.name", name, error) for error in _subdomain(name)]
    names = spec.get("names") or {}
    if name != f"{names.get('plural', '')}.{spec.get('group', '')}":
        causes.append(invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    return causes + _spec(spec, "spec")
