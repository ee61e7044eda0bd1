"""The CRD's parts written from the contract (`carpool.contract.generate`): the
`spec.batching` and `status.batching` schemas from the knobs, and the built-in handlers named
in `spec.model.handler`.

Only those blocks of the file are rewritten, so the rest of the CRD (hand-written, with its
comments and CEL rules) stays as it is. `make generate` runs this; a test fails when the
committed CRD differs from what it would write.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from carpool.contract.batching import KNOBS, Knob
from carpool.contract.handlers import BUILTIN_HANDLERS

# Where the blocks sit in the CRD: under spec's properties and under status's.
_SPEC = "            spec:"
_STATUS = "            status:"
_INDENT = " " * 16
_HEADER = f"{_INDENT}batching:"
# The column the CRD file wraps at, in its hand-written parts as in those written here.
WIDTH = 98
_DESCRIPTION = (
    "The sidecar's batching knobs, rendered into a ConfigMap that the sidecar re-reads live: "
    "changing them does not restart the pods. A knob left unset takes the operator's default "
    "(the chart's defaults.* values); status.batching shows the values in use."
)
_STATUS_DESCRIPTION = (
    "The batching settings the sidecars run with (the batching.json of the ConfigMap): "
    "spec.batching over the operator's defaults, maxBatchSize held to spec.model.maxBatchSize."
)


def _property(knob: Knob) -> dict[str, Any]:
    # No schema default: the operator's defaults (which the chart may set) fill what is unset.
    unset = (
        f"Unset: the operator's default, {knob.default} unless the chart sets defaults.{knob.key}."
    )
    schema: dict[str, Any] = {"description": f"{knob.description} {unset}"}
    if knob.choices:
        return {"type": "string", **schema, "enum": list(knob.choices)}
    # Integers even where the sidecar takes fractions: Kubernetes APIs avoid floats.
    return {"type": "integer", **schema, "minimum": knob.minimum, "maximum": knob.maximum}


def batching_schema() -> dict[str, Any]:
    """The OpenAPI schema of spec.batching."""
    return {
        "type": "object",
        "description": _DESCRIPTION,
        "properties": {knob.key: _property(knob) for knob in KNOBS},
    }


def status_batching_schema() -> dict[str, Any]:
    """The OpenAPI schema of status.batching: every knob, as the operator writes it."""
    kinds = {knob.key: "string" if knob.choices else "integer" for knob in KNOBS}
    return {
        "type": "object",
        "description": _STATUS_DESCRIPTION,
        "properties": {key: {"type": kind} for key, kind in kinds.items()},
    }


def _lines(node: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for key, value in node.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", *_lines(value, indent + "  ")]
        elif isinstance(value, list):
            lines.append(f"{indent}{key}: [{', '.join(str(item) for item in value)}]")
        elif key == "description":
            wrapped = textwrap.wrap(value, WIDTH - len(indent) - 2, break_on_hyphens=False)
            lines += [f"{indent}{key}: >-", *(f"{indent}  {line}" for line in wrapped)]
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def _with_block(lines: list[str], parent: str, schema: dict[str, Any]) -> list[str]:
    """`lines` with the `batching:` block under `parent` written from `schema`."""
    try:
        start = lines.index(_HEADER, lines.index(parent))
    except ValueError:
        raise ValueError(f"no {_HEADER.strip()!r} under {parent.strip()!r}") from None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(_INDENT + " ")):
        end += 1
    return [*lines[:start], _HEADER, *_lines(schema, _INDENT + "  "), *lines[end:]]


def with_batching(crd: str) -> str:
    """The CRD text with its spec.batching and status.batching blocks written from the knobs."""
    lines = _with_block(crd.splitlines(), _SPEC, batching_schema())
    return "\n".join(_with_block(lines, _STATUS, status_batching_schema())) + "\n"


# The handler's description, which names the built-ins (`carpool.contract.handlers`).
_HANDLER = re.compile(
    r"(?m)^(?P<indent> +)handler:\n(?P=indent)  type: string\n(?P=indent)  description: >-\n"
    r"(?:(?P=indent)    .*\n)+"
)


def with_handlers(crd: str) -> str:
    """The CRD text with spec.model.handler's description naming every built-in handler."""
    names = ", ".join(BUILTIN_HANDLERS)
    text = (
        f"A built-in handler ({names}) or a Python class as module:Class importable in the image."
    )

    def block(match: re.Match[str]) -> str:
        indent = match.group("indent")
        head = f"{indent}handler:\n{indent}  type: string\n{indent}  description: >-\n"
        wrapped = textwrap.wrap(text, WIDTH - len(indent) - 4, break_on_hyphens=False)
        return head + "".join(f"{indent}    {line}\n" for line in wrapped)

    written, count = _HANDLER.subn(block, crd, count=1)
    if count != 1:
        raise ValueError("no spec.model.handler with a folded description in the CRD")
    return written
