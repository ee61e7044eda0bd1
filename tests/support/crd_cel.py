"""CEL rules of a CRD as the API server compiles them, and as it runs them on `default`s.

Compiling parses the rule with cel-python and then checks, as the API server's type checker
does, that every field a rule selects from `self` (or `oldSelf`) is declared: at the root
`self.metadata` holds only `name` and `generateName`; a map (`additionalProperties`) takes any
key; an int-or-string is dynamic. Errors read `compilation failed: ERROR: <input>:L:C: ...`
like cel-go's; the text of a syntax error is cel-python's. Not modelled: the other checks of
cel-go's type checker (function signatures, a rule that is not a bool), cost estimation, and
the Kubernetes CEL libraries beyond what cel-python has.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import celpy
import lark
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from carpool_operator.schema import Cause
from support.crd_field_path import FieldPathError, resolve
from support.kube_field import OMIT, child, duplicate, forbidden, invalid, key, required

_RESERVED = frozenset(
    {
        "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
        "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
        "void", "while",
    }
)  # fmt: skip


def escape(name: str) -> str | None:
    """A property's name in CEL (`__dash__` for '-', ...), or None if it cannot be named."""
    if not name or name[0].isdigit():
        return None
    if name in _RESERVED:
        return f"__{name}__"
    if any(not (c.isascii() and (c.isalnum() or c in "_-./")) for c in name):
        return None
    escaped = name.replace("__", "__underscores__")
    for char, word in ((".", "dot"), ("-", "dash"), ("/", "slash")):
        escaped = escaped.replace(char, f"__{word}__")
    return escaped


def _with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    """A resource root as CEL sees it: apiVersion, kind, metadata.name, metadata.generateName."""
    string = {"type": "string"}
    meta = {"type": "object", "properties": {"name": string, "generateName": string}}
    properties = dict(schema.get("properties") or {})
    properties.update(apiVersion=string, kind=string, metadata=meta)
    return {**schema, "properties": properties}


def exposed(schema: dict[str, Any]) -> bool:
    """Whether CEL can see a value of this schema at all (the API server's SchemaDeclType)."""
    if schema.get("x-kubernetes-int-or-string"):
        return True
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return isinstance(items, dict) and exposed(items)
    if kind == "object":
        extra = schema.get("additionalProperties")
        return exposed(extra) if isinstance(extra, dict) else True
    return kind in ("string", "boolean", "number", "integer")


def _field(schema: dict[str, Any], name: str, root: bool) -> tuple[bool, dict[str, Any] | None]:
    """Selecting `name`: (declared, the schema to keep checking or None to stop checking)."""
    if schema.get("x-kubernetes-int-or-string") or schema.get("type") != "object":
        return True, None  # dynamic, or a selection cel-go refuses for another reason
    if root or schema.get("x-kubernetes-embedded-resource"):
        schema = _with_object_meta(schema)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return True, extra
    for property_name, sub in (schema.get("properties") or {}).items():
        if escape(property_name) == name and exposed(sub):
            return True, sub
    return False, None


@dataclass(frozen=True)
class _Select:
    name: str
    line: int
    column: int  # 1-based, of the '.'


def _chain(member: lark.Tree[Any]) -> list[_Select] | None:
    """The selections of `self.a.b` (or `oldSelf...`), or None for any other expression."""
    if len(member.children) != 1 or not isinstance(member.children[0], lark.Tree):
        return None
    node = member.children[0]
    if node.data == "primary":
        (ident,) = node.children
        is_self = isinstance(ident, lark.Tree) and ident.data == "ident"
        return [] if is_self and str(ident.children[0]) in ("self", "oldSelf") else None
    if node.data != "member_dot" or not isinstance(node.children[0], lark.Tree):
        return None
    base = _chain(node.children[0])
    token = node.children[1]
    if base is None or not isinstance(token, lark.Token):
        return None
    line, column = token.line or 1, token.column or 1
    return [*base, _Select(str(token), line, max(1, column - 1))]


def _report(source: str, line: int, column: int, message: str) -> str:
    text = source.splitlines()[line - 1] if source.splitlines() else source
    return f"ERROR: <input>:{line}:{column}: {message}\n | {text}\n | {'.' * (column - 1)}^"


def undefined_fields(
    source: str, tree: lark.Tree[Any], schema: dict[str, Any], root: bool
) -> list[str]:
    """cel-go's `undefined field` errors for the selections from `self` in a parsed rule."""
    reported: dict[tuple[int, int], str] = {}
    for member in tree.find_data("member"):
        chain = _chain(member)
        node: dict[str, Any] | None = schema
        for step, select in enumerate(chain or []):
            if node is None:
                break
            declared, node = _field(node, select.name, root=root and step == 0)
            if not declared:
                where = (select.line, select.column)
                message = f"undefined field '{select.name}'"
                reported[where] = _report(source, *where, message)
                break
    return [reported[where] for where in sorted(reported)]


@functools.cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


def compile_errors(source: str, schema: dict[str, Any], root: bool) -> list[str]:
    """Why the API server would not compile `source` with `self` of `schema`; [] if it would.

    `root`: the schema is a resource's root, where `self.metadata` has name and generateName.
    """
    try:
        tree = _environment().compile(source)
    except CELParseError as error:
        line = getattr(error, "line", None) or 1
        column = getattr(error, "column", None) or 1
        return [_report(source, line, column, "Syntax error")]
    return undefined_fields(source, tree, schema, root)


@functools.cache
def _program(source: str) -> Any:
    environment = _environment()
    return environment.program(environment.compile(source))


def _evaluation_error(error: CELEvalError) -> str:
    """cel-go's words for an evaluation error: `no such key: x` for a missing field."""
    detail = str(error.args[0]) if error.args else "evaluation error"
    if len(error.args) > 1 and error.args[1] is KeyError and ":" in detail:
        return "no such key: " + detail.rsplit(":", 1)[1].strip().strip("'")
    return detail


def _rule_text(rule: dict[str, Any]) -> str:
    return str(rule.get("message") or rule.get("rule", "")).strip()


def _failure(path: str, value: Any, detail: str, reason: str | None) -> Cause:
    if reason == "FieldValueForbidden":
        return forbidden(path, detail)
    if reason == "FieldValueRequired":
        return required(path, detail)
    if reason == "FieldValueDuplicate":
        return duplicate(path, value)
    return invalid(path, value, detail)


def evaluate(value: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    """The rules on `schema` and below, run on `value` as the API server runs them on a default."""
    if value is None:
        return []
    causes: list[Cause] = []
    kind = str(schema.get("type", ""))
    for rule in schema.get("x-kubernetes-validations") or []:
        if not str(rule.get("rule", "")).strip():
            continue
        try:
            holds = _program(rule["rule"]).evaluate({"self": json_to_cel(value)})
        except CELEvalError as error:
            detail = f"{_evaluation_error(error)} evaluating rule: {_rule_text(rule)}"
            causes.append(invalid(path, kind, detail))
            continue
        if holds is True or bool(holds) is True:
            continue
        where = path
        if rule.get("fieldPath"):
            with contextlib.suppress(FieldPathError):  # a path that does not resolve is ignored
                where = child(path, resolve(str(rule["fieldPath"]), schema)[0])
        shown = OMIT if kind in ("object", "array") else value
        detail = str(rule.get("message", "")).strip() or f"failed rule: {_rule_text(rule)}"
        causes.append(_failure(where, shown, detail, rule.get("reason")))
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    if isinstance(value, dict):
        for name, item in value.items():
            if name in properties:
                causes += evaluate(item, properties[name], child(path, name))
            elif isinstance(extra, dict):
                causes += evaluate(item, extra, key(path, name))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for number, item in enumerate(value):
            causes += evaluate(item, schema["items"], f"{path}[{number}]")
    return causes
