"""The CRD's parts written from the contract (`carpool.contract.generate`): the
`spec.batching` schema from the knobs, and the built-in handlers named in `spec.model.handler`.

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

# Where the block sits in the CRD: under spec's properties, before status.
_SPEC = "            spec:"
_INDENT = " " * 16
_HEADER = f"{_INDENT}batching:"
_WIDTH = 98  # the column the rest of the file wraps at
_DESCRIPTION = (
    "The sidecar's batching knobs, rendered into a ConfigMap that the sidecar re-reads live: "
    "changing them does not restart the pods. A knob left unset takes the operator's default "
    "(the chart's defaults.* values); status.batching shows the values in use."
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


def _lines(node: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for key, value in node.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", *_lines(value, indent + "  ")]
        elif isinstance(value, list):
            lines.append(f"{indent}{key}: [{', '.join(str(item) for item in value)}]")
        elif key == "description":
            wrapped = textwrap.wrap(value, _WIDTH - len(indent) - 2, break_on_hyphens=False)
            lines += [f"{indent}{key}: >-", *(f"{indent}  {line}" for line in wrapped)]
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines


def with_batching(crd: str) -> str:
    """The CRD text with its spec.batching block written from the knobs."""
    lines = crd.splitlines()
    try:
        start = lines.index(_HEADER, lines.index(_SPEC))
    except ValueError:
        raise ValueError(f"no {_HEADER.strip()!r} under {_SPEC.strip()!r}") from None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(_INDENT + " ")):
        end += 1
    block = [_HEADER, *_lines(batching_schema(), _INDENT + "  ")]
    return "\n".join([*lines[:start], *block, *lines[end:]]) + "\n"


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
        wrapped = textwrap.wrap(text, _WIDTH - len(indent) - 4, break_on_hyphens=False)
        return head + "".join(f"{indent}    {line}\n" for line in wrapped)

    written, count = _HANDLER.subn(block, crd, count=1)
    if count != 1:
        raise ValueError("no spec.model.handler with a folded description in the CRD")
    return written
