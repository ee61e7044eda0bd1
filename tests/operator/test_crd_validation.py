"""The test API server refuses a CustomResourceDefinition as a real API server does.

Each case is a small CRD that breaks one rule of apiextensions-apiserver's validation; the
server answers 422 Invalid with the real field path and message. A CRD that keeps every rule
is stored, and an update that breaks one is refused like a create.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.kube_api import ServedKubeApi
from support.kube_http import call

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NAME = "samples.test.carpool.dev"
ROOT = "spec.validation.openAPIV3Schema"
SPEC = f"{ROOT}.properties[spec]"
Json = dict[str, Any]


@pytest.fixture(scope="module")
def served() -> Iterator[ServedKubeApi]:
    with ServedKubeApi() as server:
        yield server


def sample_crd(spec_schema: Json | None = None, metadata: Json | None = None, **root: Any) -> Json:
    """A valid CRD of kind Sample; `spec_schema` replaces its spec's schema, `metadata` is
    declared beside it, `root` adds to the root schema."""
    spec = spec_schema or {
        "type": "object",
        "properties": {"size": {"type": "integer", "minimum": 1, "default": 1}},
    }
    declared = {"spec": spec, **({"metadata": metadata} if metadata else {})}
    schema = {"type": "object", "properties": declared, **root}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": {
            "group": "test.carpool.dev",
            "scope": "Namespaced",
            "names": {"kind": "Sample", "plural": "samples"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def refusal(served: ServedKubeApi, crd: Json) -> list[tuple[str, str, str]]:
    """The causes of the 422 the server answers (reason, field, message); fails if stored."""
    status, answer = call(served, "POST", CRDS, crd)
    if status == 201:
        call(served, "DELETE", f"{CRDS}/{crd['metadata']['name']}")
    assert (status, answer.get("reason")) == (422, "Invalid"), answer
    causes = answer["details"]["causes"]
    texts = list(dict.fromkeys(f"{cause['field']}: {cause['message']}" for cause in causes))
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    name = crd["metadata"]["name"]
    expected = f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: {summary}'
    assert answer["message"] == expected
    assert answer["details"]["kind"] == "CustomResourceDefinition"
    return [(cause["reason"], cause["field"], cause["message"]) for cause in causes]


def one_refusal(served: ServedKubeApi, crd: Json) -> tuple[str, str, str]:
    causes = refusal(served, crd)
    assert len(causes) == 1, causes
    return causes[0]


def spec_with(**fields: Json) -> Json:
    return {"type": "object", "properties": fields}


def rule(text: str, **extra: Any) -> Json:
    return {"rule": text, **extra}


INTEGER = {"type": "integer"}
STRING = {"type": "string"}


def test_a_crd_that_keeps_every_rule_is_stored_and_established(served: ServedKubeApi) -> None:
    """Every construct the rules below refuse, written the way a real server accepts it."""
    crd = sample_crd(
        spec_with(
            size=INTEGER,
            ports={"type": "object", "additionalProperties": INTEGER},
            surge={"x-kubernetes-int-or-string": True, "anyOf": [INTEGER, STRING]},
            tags={"type": "array", "items": STRING, "x-kubernetes-list-type": "set"},
            listeners={
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {"name": STRING}},
            },
            limits={
                "type": "object",
                "default": {},
                "properties": {"low": INTEGER, "high": INTEGER},
                "x-kubernetes-validations": [
                    rule("!has(self.low) || !has(self.high) || self.low <= self.high")
                ],
            },
        ),
        metadata={"type": "object", "properties": {"name": STRING}},
        **{
            "x-kubernetes-validations": [
                rule("size(self.metadata.name) <= 20", fieldPath=".metadata.name", message="short"),
                rule("self.spec.ports['http'] > 0", fieldPath=".spec.ports['http']"),
                rule("!has(self.spec.size) || self.spec.size < 9", reason="FieldValueForbidden"),
            ]
        },
    )
    crd["spec"]["versions"][0]["subresources"] = {"status": {}}
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}
    ]
    status, stored = call(served, "POST", CRDS, crd)
    try:
        assert status == 201, stored
        conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
        assert conditions["Established"] == "True"
    finally:
        call(served, "DELETE", f"{CRDS}/{NAME}")


Case = tuple[Callable[[], Json], str, str, str]  # the CRD; reason, field, message of the cause

CASES: dict[str, Case] = {
    "root fieldPath into undeclared metadata": (
        lambda: sample_crd(
            **{
                "x-kubernetes-validations": [
                    rule("self.metadata.name.size() < 9", fieldPath=".metadata.name")
                ]
            }
        ),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].fieldPath",
        'Invalid value: ".metadata.name": must be a valid path',
    ),
    "fieldPath to a property not declared": (
        lambda: sample_crd(
            **{"x-kubernetes-validations": [rule("self.spec.size > 0", fieldPath=".spec.count")]}
        ),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].fieldPath",
        'Invalid value: ".spec.count": must be a valid path',
    ),
    "fieldPath into a list": (
        lambda: sample_crd(
            spec_with(
                tags={
                    "type": "array",
                    "items": STRING,
                    "x-kubernetes-validations": [rule("size(self) > 0", fieldPath="[0]")],
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[tags].x-kubernetes-validations[0].fieldPath",
        'Invalid value: "[0]": must be a valid path',
    ),
    "fieldPath without its leading dot": (
        lambda: sample_crd(
            **{"x-kubernetes-validations": [rule("self.spec.size > 0", fieldPath="spec.size")]}
        ),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].fieldPath",
        'Invalid value: "spec.size": must be a valid path',
    ),
    "a property without a type": (
        lambda: sample_crd(spec_with(size={"minimum": 1})),
        "FieldValueRequired",
        f"{SPEC}.properties[size].type",
        "Required value: must not be empty for specified object fields",
    ),
    "array items without a type": (
        lambda: sample_crd(spec_with(tags={"type": "array", "items": {"maxLength": 3}})),
        "FieldValueRequired",
        f"{SPEC}.properties[tags].items.type",
        "Required value: must not be empty for specified array items",
    ),
    "an array without items": (
        lambda: sample_crd(spec_with(tags={"type": "array"})),
        "FieldValueRequired",
        f"{SPEC}.properties[tags].items",
        "Required value: must be specified",
    ),
    "a type OpenAPI v3 does not have": (
        lambda: sample_crd(spec_with(size={"type": "float"})),
        "FieldValueNotSupported",
        f"{SPEC}.properties[size].type",
        'Unsupported value: "float": supported values: "array", "boolean", "integer", '
        '"number", "object", "string"',
    ),
    "properties and additionalProperties together": (
        lambda: sample_crd(
            spec_with(
                limits={
                    "type": "object",
                    "properties": {"low": INTEGER},
                    "additionalProperties": False,
                }
            )
        ),
        "FieldValueForbidden",
        f"{SPEC}.properties[limits].additionalProperties",
        "Forbidden: additionalProperties and properties are mutual exclusive",
    ),
    "metadata restricting more than the name": (
        lambda: sample_crd(
            metadata={"type": "object", "properties": {"labels": {"type": "object"}}}
        ),
        "FieldValueForbidden",
        f"{ROOT}.properties[metadata]",
        "Forbidden: must not specify anything other than name and generateName, but metadata "
        "is implicitly specified",
    ),
    "a default inside metadata": (
        lambda: sample_crd(
            metadata={"type": "object", "properties": {"name": {**STRING, "default": "a"}}}
        ),
        "FieldValueForbidden",
        f"{ROOT}.properties[metadata].properties[name].default",
        "Forbidden: must not be set in top-level metadata",
    ),
    "uniqueItems": (
        lambda: sample_crd(spec_with(tags={"type": "array", "items": STRING, "uniqueItems": True})),
        "FieldValueForbidden",
        f"{SPEC}.properties[tags].uniqueItems",
        "Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes "
        "quadratic",
    ),
    "a description inside anyOf": (
        lambda: sample_crd(
            spec_with(
                size={
                    "type": "integer",
                    "anyOf": [{"minimum": 1, "description": "positive"}],
                }
            )
        ),
        "FieldValueForbidden",
        f"{SPEC}.properties[size].anyOf[0].description",
        "Forbidden: must be empty to be structural",
    ),
    "a nested property not declared outside the anyOf": (
        lambda: sample_crd(
            spec_with(size=INTEGER),
            anyOf=[{"properties": {"status": {"required": ["phase"]}}}],
        ),
        "FieldValueRequired",
        f"{ROOT}.properties[status]",
        f"Required value: because it is defined in {ROOT}.anyOf[0].properties[status]",
    ),
    "x-kubernetes-preserve-unknown-fields false": (
        lambda: sample_crd(
            spec_with(
                extra={
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": False,
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[extra].x-kubernetes-preserve-unknown-fields",
        "Invalid value: false: must be true or undefined",
    ),
    "a default its schema refuses": (
        lambda: sample_crd(spec_with(size={"type": "integer", "minimum": 1, "default": 0})),
        "FieldValueInvalid",
        f"{SPEC}.properties[size].default",
        f"Invalid value: 0: {SPEC}.properties[size].default in body should be greater than or "
        "equal to 1",
    ),
    "a default with a field its schema prunes": (
        lambda: sample_crd(
            spec_with(
                limits={
                    "type": "object",
                    "properties": {"low": INTEGER},
                    "default": {"high": 2},
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[limits].default",
        'Invalid value: {"high":2}: must not have unknown fields',
    ),
    "a default its own CEL rule cannot read": (
        lambda: sample_crd(
            spec_with(
                limits={
                    "type": "object",
                    "default": {},
                    "properties": {
                        "low": {**INTEGER, "default": 1},
                        "high": {**INTEGER, "default": 2},
                    },
                    "x-kubernetes-validations": [
                        rule("self.low <= self.high", message="low > high")
                    ],
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[limits].default",
        'Invalid value: "object": no such key: low evaluating rule: low > high',
    ),
    "a default that breaks its CEL rule": (
        lambda: sample_crd(
            spec_with(
                size={
                    **INTEGER,
                    "default": 12,
                    "x-kubernetes-validations": [rule("self < 10")],
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[size].default",
        "Invalid value: 12: failed rule: self < 10",
    ),
    "a set of objects that are not atomic": (
        lambda: sample_crd(
            spec_with(
                pairs={
                    "type": "array",
                    "x-kubernetes-list-type": "set",
                    "items": {"type": "object", "properties": {"a": STRING}},
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[pairs].items.x-kubernetes-map-type",
        "Invalid value: null: must be atomic as item of a list with x-kubernetes-list-type=set",
    ),
    "a map list key neither required nor defaulted": (
        lambda: sample_crd(
            spec_with(
                listeners={
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": STRING}},
                }
            )
        ),
        "FieldValueRequired",
        f"{SPEC}.properties[listeners].items.properties[name].default",
        "Required value: this property is in x-kubernetes-list-map-keys, so it must have a "
        "default or be a required property",
    ),
    "a map list keyed by an object": (
        lambda: sample_crd(
            spec_with(
                listeners={
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "object"}},
                    },
                }
            )
        ),
        "FieldValueInvalid",
        f"{SPEC}.properties[listeners].items.properties[name].type",
        'Invalid value: "object": must be a scalar type if parent array\'s '
        "x-kubernetes-list-type is map",
    ),
    "a list type on an object": (
        lambda: sample_crd(spec_with(limits={"type": "object", "x-kubernetes-list-type": "set"})),
        "FieldValueInvalid",
        f"{SPEC}.properties[limits].type",
        'Invalid value: "object": must be array if x-kubernetes-list-type is specified',
    ),
    "a map type the server does not know": (
        lambda: sample_crd(spec_with(limits={"type": "object", "x-kubernetes-map-type": "merge"})),
        "FieldValueNotSupported",
        f"{SPEC}.properties[limits].x-kubernetes-map-type",
        'Unsupported value: "merge": supported values: "atomic", "granular"',
    ),
    "an empty rule": (
        lambda: sample_crd(**{"x-kubernetes-validations": [rule("  ")]}),
        "FieldValueRequired",
        f"{ROOT}.x-kubernetes-validations[0].rule",
        "Required value: rule is not specified",
    ),
    "a message with a line break": (
        lambda: sample_crd(
            **{"x-kubernetes-validations": [rule("has(self.spec)", message="spec is\nmissing")]}
        ),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].message",
        'Invalid value: "spec is\\nmissing": must not contain line breaks',
    ),
    "a blank message": (
        lambda: sample_crd(**{"x-kubernetes-validations": [rule("has(self.spec)", message=" ")]}),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].message",
        'Invalid value: " ": must be non-empty if specified',
    ),
    "a multi-line rule without a message": (
        lambda: sample_crd(**{"x-kubernetes-validations": [rule("has(self.spec) &&\ntrue")]}),
        "FieldValueRequired",
        f"{ROOT}.x-kubernetes-validations[0].message",
        "Required value: message must be specified if rule contains line breaks",
    ),
    "a reason the server does not know": (
        lambda: sample_crd(
            **{"x-kubernetes-validations": [rule("has(self.spec)", reason="FieldValueTooLong")]}
        ),
        "FieldValueNotSupported",
        f"{ROOT}.x-kubernetes-validations[0].reason",
        'Unsupported value: "FieldValueTooLong": supported values: "FieldValueDuplicate", '
        '"FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"',
    ),
    "a rule reading a field not declared": (
        lambda: sample_crd(**{"x-kubernetes-validations": [rule("self.spec.count > 0")]}),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].rule",
        'Invalid value: {"Rule":"self.spec.count \\u003e 0","Message":"","MessageExpression":"",'
        '"Reason":null,"FieldPath":"","OptionalOldSelf":null}: compilation failed: ERROR: '
        "<input>:1:10: undefined field 'count'\n | self.spec.count > 0\n | .........^",
    ),
    "a root rule reading metadata beyond the name": (
        lambda: sample_crd(
            **{"x-kubernetes-validations": [rule("has(self.metadata.labels)", message="labelled")]}
        ),
        "FieldValueInvalid",
        f"{ROOT}.x-kubernetes-validations[0].rule",
        'Invalid value: {"Rule":"has(self.metadata.labels)","Message":"labelled",'
        '"MessageExpression":"","Reason":null,"FieldPath":"","OptionalOldSelf":null}: '
        "compilation failed: ERROR: <input>:1:18: undefined field 'labels'\n"
        " | has(self.metadata.labels)\n | .................^",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_crd_breaking_one_rule_is_refused_with_the_servers_message(
    served: ServedKubeApi, case: str
) -> None:
    build, reason, field, message = CASES[case]
    assert one_refusal(served, build()) == (reason, field, message)
    status, _ = call(served, "GET", f"{CRDS}/{NAME}")
    assert status == 404


@pytest.mark.parametrize(
    ("validation", "field", "value"),
    [
        (rule("self.spec.size >"), "rule", '{"Rule":"self.spec.size \\u003e","Message":""'),
        (
            rule("has(self.spec)", messageExpression="'no spec' +"),
            "messageExpression",
            '{"Rule":"has(self.spec)","Message":"","MessageExpression":"\'no spec\' +"',
        ),
    ],
)
def test_cel_that_does_not_parse_is_refused_where_it_stands(
    served: ServedKubeApi, validation: Json, field: str, value: str
) -> None:
    """The syntax error's own words are cel-python's, not cel-go's: only its frame is real."""
    crd = sample_crd(**{"x-kubernetes-validations": [validation]})
    reason, where, message = one_refusal(served, crd)
    assert (reason, where) == ("FieldValueInvalid", f"{ROOT}.x-kubernetes-validations[0].{field}")
    failed = "compilation failed" if field == "rule" else "messageExpression compilation failed"
    assert message.startswith(f"Invalid value: {value}")
    assert f"}}: {failed}: ERROR: <input>:1:" in message
    assert "Syntax error" in message


def test_int_or_string_takes_the_bare_any_of_alone(served: ServedKubeApi) -> None:
    bounded = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{**INTEGER, "maximum": 9}, {**STRING, "pattern": "^[0-9]+%$"}],
    }
    where = f"{SPEC}.properties[surge].anyOf"
    assert refusal(served, sample_crd(spec_with(surge=bounded))) == [
        ("FieldValueForbidden", f"{where}[0].type", "Forbidden: must be empty to be structural"),
        ("FieldValueForbidden", f"{where}[1].type", "Forbidden: must be empty to be structural"),
    ]


def test_versions_names_and_columns(served: ServedKubeApi) -> None:
    crd = sample_crd()
    crd["metadata"]["name"] = "samples.carpool.dev"
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "Size", "type": "int", "jsonPath": "spec.size"}
    ]
    second = copy.deepcopy(crd["spec"]["versions"][0])
    second["name"] = "v2"
    crd["spec"]["versions"].append(second)
    fields = [(field, message.split(": ")[-1]) for _, field, message in refusal(served, crd)]
    assert fields == [
        ("metadata.name", 'must be spec.names.plural+"."+spec.group'),
        ("spec.versions", "must have exactly one version marked as storage version"),
        (
            "spec.additionalPrinterColumns[0].type",
            "must be one of boolean,date,integer,number,string",
        ),
        ("spec.additionalPrinterColumns[0].JSONPath", "must be a simple json path starting with ."),
    ]


def test_versions_with_their_own_schemas_are_named_by_version(served: ServedKubeApi) -> None:
    crd = sample_crd()
    second = copy.deepcopy(crd["spec"]["versions"][0])
    second.update(name="v2", storage=False)
    second["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"] = {}
    crd["spec"]["versions"].append(second)
    assert one_refusal(served, crd) == (
        "FieldValueRequired",
        "spec.versions[1].schema.openAPIV3Schema.properties[spec].properties[size].type",
        "Required value: must not be empty for specified object fields",
    )


def test_a_root_with_a_status_subresource_holds_only_what_status_extraction_keeps(
    served: ServedKubeApi,
) -> None:
    crd = sample_crd(minProperties=1)
    crd["spec"]["versions"][0]["subresources"] = {"status": {}}
    ((reason, field, message),) = refusal(served, crd)
    assert (reason, field) == ("FieldValueInvalid", ROOT)
    assert message.endswith(
        "fields are allowed at the root of the schema if the status subresource is enabled"
    )


def test_an_update_that_breaks_a_rule_is_refused_and_changes_nothing(
    served: ServedKubeApi,
) -> None:
    status, created = call(served, "POST", CRDS, sample_crd())
    assert status == 201, created
    try:
        broken = {"x-kubernetes-validations": [rule("self.spec.size > 0", fieldPath=".spec.nope")]}
        patch = {"spec": {"versions": [
            {**sample_crd()["spec"]["versions"][0], "schema": {"openAPIV3Schema": {
                **sample_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], **broken,
            }}}
        ]}}  # fmt: skip
        status, answer = call(
            served, "PATCH", f"{CRDS}/{NAME}", patch, "application/merge-patch+json"
        )
        assert (status, answer["reason"]) == (422, "Invalid")
        assert answer["details"]["causes"][0]["field"] == (
            f"{ROOT}.x-kubernetes-validations[0].fieldPath"
        )
        _, stored = call(served, "GET", f"{CRDS}/{NAME}")
        assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    finally:
        call(served, "DELETE", f"{CRDS}/{NAME}")
