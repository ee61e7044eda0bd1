"""Write what the knob table defines in files beside the code: `make generate`.

    python -m carpool.contract.generate [REPOSITORY]

- the CRD's `spec.batching` schema and the built-in handlers its `spec.model.handler`
  names (`crds/batchedmodels.carpool.dev.yaml`, see `crd`);
- the chart's `defaults:` values, with their comments, and their schema
  (`charts/carpool/values.yaml`, `values.schema.json`);
- the docs' knob tables, each between `<!-- knobs: NAME -->` and `<!-- end knobs -->`.

Each writer maps the file's text to its text with the generated part replaced, leaving the
rest as written by hand; `tests/contract/test_knobs.py` fails when a committed file differs.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from carpool.contract.batching import IN_PROCESS_DEFAULTS, KNOBS, Knob
from carpool.contract.crd import with_batching, with_handlers
from carpool.contract.crd_model_path import with_model_path_rules
from carpool.contract.pod import default_flag, default_variable

_WIDTH = 100


def _value(value: float | str) -> str:
    """A default as YAML and the docs write it: 5, not 5.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# ---- the chart --------------------------------------------------------------------------


def _values_block() -> list[str]:
    lines = ["defaults:"]
    for knob in KNOBS:
        variable = default_variable(knob.attribute)
        comment = f"defaults.{knob.key} -- {knob.description} The operator's {variable}."
        lines += textwrap.wrap(
            comment, _WIDTH, initial_indent="  # ", subsequent_indent="  # ", break_on_hyphens=False
        )
        lines.append(f"  {knob.key}: {_value(knob.default)}")
    return lines


def with_chart_defaults(values: str) -> str:
    """values.yaml with its `defaults:` block written from the knobs."""
    lines = values.splitlines()
    start = lines.index("defaults:")
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return "\n".join([*lines[:start], *_values_block(), *lines[end:]]) + "\n"


def _schema(knob: Knob) -> dict[str, Any]:
    schema: dict[str, Any] = {"description": knob.description}
    if knob.choices:
        return {"type": "string", **schema, "enum": list(knob.choices)}
    # Integers, as the CRD's: the operator's values stay whole numbers.
    return {"type": "integer", **schema, "minimum": knob.minimum, "maximum": knob.maximum}


def with_chart_schema(schema: str) -> str:
    """values.schema.json with `defaults`' properties written from the knobs."""
    document = json.loads(schema)
    defaults = document["properties"]["defaults"]
    defaults["properties"] = {knob.key: _schema(knob) for knob in KNOBS}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# ---- the docs' tables -------------------------------------------------------------------


def _sidecar_table() -> list[str]:
    rows = ["| flag | variable | file key | default | meaning |", "|---|---|---|---|---|"]
    for knob in KNOBS:
        rows.append(
            f"| `{knob.flag}` | `{knob.variable}` | `{knob.key}` | {_value(knob.default)} "
            f"| {knob.summary} |"
        )
    return rows


def _operator_table() -> list[str]:
    rows = ["| flag | variable | chart value | built-in |", "|---|---|---|---|"]
    for knob in KNOBS:
        rows.append(
            f"| `{default_flag(knob.attribute)}` | `{default_variable(knob.attribute)}` "
            f"| `defaults.{knob.key}` | {_value(knob.default)} |"
        )
    return rows


def _library_table() -> list[str]:
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for knob in KNOBS:
        default = _value(getattr(IN_PROCESS_DEFAULTS, knob.attribute))
        rows.append(f"| `{knob.attribute}` | {default} | {knob.summary} |")
    return rows


TABLES: dict[str, Callable[[], list[str]]] = {
    "sidecar": _sidecar_table,
    "operator": _operator_table,
    "library": _library_table,
}
_TABLE = re.compile(r"(<!-- knobs: (\w+) -->\n)(.*?)(<!-- end knobs -->)", re.DOTALL)


def with_tables(document: str) -> str:
    """A Markdown document with each marked knob table written from the knobs."""

    def table(match: re.Match[str]) -> str:
        rows = TABLES[match.group(2)]()
        return match.group(1) + "\n".join(rows) + "\n" + match.group(4)

    return _TABLE.sub(table, document)


# ---- every file -------------------------------------------------------------------------

WRITERS: dict[str, Callable[[str], str]] = {
    "crds/batchedmodels.carpool.dev.yaml": lambda crd: with_model_path_rules(
        with_handlers(with_batching(crd))
    ),
    "charts/carpool/values.yaml": with_chart_defaults,
    "charts/carpool/values.schema.json": with_chart_schema,
    "docs/sidecar.md": with_tables,
    "docs/operator.md": with_tables,
    "docs/library.md": with_tables,
}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m carpool.contract.generate [REPOSITORY]", file=sys.stderr)
        return 2
    root = Path(argv[0] if argv else ".")
    for name, write in WRITERS.items():
        path = root / name
        path.write_text(write(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
