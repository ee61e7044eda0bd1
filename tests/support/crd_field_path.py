"""A CEL rule's `fieldPath`, resolved against the schema the rule sits on, as the API server does.

The path is a chain of `.name` and `['name']` steps (in quotes, with backslash escapes), each
naming a declared property or, on a map (`additionalProperties`), any key. There are no list
indices: a path cannot enter a list. The API server refuses a rule whose path does not resolve
with `must be a valid path`; in particular a root rule's `.metadata.name` resolves only where
the root schema declares `metadata.properties.name`.
"""

from __future__ import annotations

import re
from typing import Any

from support.kube_field import child, key

_TOKENS = re.compile(r"'(?:[^'\\]|\\.)*'|[.\[\]]|[^.\[\]]+")
_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "'": "'", "\\": "\\",
}  # fmt: skip


class FieldPathError(ValueError):
    pass


def _unescape(quoted: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(1) not in _ESCAPES:
            raise FieldPathError(f"invalid string literal: invalid escape char {match.group(0)}")
        return _ESCAPES[match.group(1)]

    return re.sub(r"\\(.)", replace, quoted)


def _step(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The schema one step down: a declared property, or a map's values."""
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    if properties:
        if name not in properties:
            raise FieldPathError("does not refer to a valid field")
        found: dict[str, Any] = properties[name]
        return found
    if extra is not None and extra is not False:
        return extra if isinstance(extra, dict) else {}
    raise FieldPathError("does not refer to a valid field")


def resolve(path: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The normalized field path (`a.b[c]`) and the schema it leads to; FieldPathError if none."""
    tokens = _TOKENS.findall(path)
    normalized = ""
    position = 0
    while position < len(tokens):
        token = tokens[position]
        position += 1
        if token not in (".", "["):
            raise FieldPathError(f"expected [ or . but got: {token}")
        if position >= len(tokens):
            raise FieldPathError("unexpected end of JSON path")
        name = tokens[position]
        position += 1
        if token == "[":
            if len(name) < 2 or name[0] != "'" or name[-1] != "'":
                raise FieldPathError(f"expected single quoted string but got {name}")
            name = _unescape(name[1:-1])
        named = bool(schema.get("properties"))
        schema = _step(schema, name)
        normalized = child(normalized, name) if named else key(normalized, name)
        if token == "[":
            if position >= len(tokens):
                raise FieldPathError("unexpected end of JSON path")
            if tokens[position] != "]":
                raise FieldPathError(f"expected ] but got {tokens[position]}")
            position += 1
    return normalized, schema
