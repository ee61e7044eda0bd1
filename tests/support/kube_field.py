"""Field errors worded as the API server words them (apimachinery's util/validation/field).

A field error is a `Cause`: the field's path, the body (`Invalid value: "x": detail`) and the
reason (`FieldValueInvalid`, ...). Paths are plain strings built with `child`, `key` and
`index`, as `spec.versions[0].schema.openAPIV3Schema.properties[spec]`.
"""

from __future__ import annotations

import json
from typing import Any

from carpool_operator.schema import Cause

OMIT = object()  # a bad value the body leaves out, as the CEL validator does for objects


def child(path: str, *names: str) -> str:
    for name in names:
        path = f"{path}.{name}" if path else name
    return path


def key(path: str, name: str) -> str:
    return f"{path}[{name}]"


def index(path: str, number: int) -> str:
    return f"{path}[{number}]"


def go_json(value: Any) -> str:
    """JSON as Go's encoding/json writes it: compact, with <, > and & escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def show(value: Any) -> str:
    """A bad value as the error body prints it: strings quoted, numbers bare, the rest JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return go_json(value)


def _with(body: str, detail: str) -> str:
    return f"{body}: {detail}" if detail else body


def invalid(path: str, value: Any, detail: str) -> Cause:
    body = "Invalid value" if value is OMIT else f"Invalid value: {show(value)}"
    return Cause(path, _with(body, detail), "FieldValueInvalid")


def required(path: str, detail: str = "") -> Cause:
    return Cause(path, _with("Required value", detail), "FieldValueRequired")


def forbidden(path: str, detail: str) -> Cause:
    return Cause(path, _with("Forbidden", detail), "FieldValueForbidden")


def duplicate(path: str, value: Any) -> Cause:
    return Cause(path, f"Duplicate value: {show(value)}", "FieldValueDuplicate")


def not_supported(path: str, value: Any, allowed: list[str]) -> Cause:
    listed = ", ".join(show(item) for item in allowed)
    body = f"Unsupported value: {show(value)}: supported values: {listed}"
    return Cause(path, body, "FieldValueNotSupported")


def text(cause: Cause) -> str:
    """The error as one line of a Status message: `field: body`."""
    return f"{cause.field}: {cause.message}"
