"""Server-side printing (`Accept: ...;as=Table`) for `kubectl get`.

Custom resources get their CRD's additionalPrinterColumns, evaluated with the small JSONPath
subset CRDs use in practice (`.a.b`, `[0]`, `[?(@.k=="v")]`); built-in kinds get Name and Age.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_STEP = re.compile(r'\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]')


def jsonpath(document: Any, path: str) -> list[Any]:
    """All values at `path`: several when a filter matches several items."""
    nodes = [document]
    position = 0
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {position}")
        position = match.end()
        key, index, field, value = match.groups()
        found: list[Any] = []
        for node in nodes:
            if key is not None and isinstance(node, dict) and key in node:
                found.append(node[key])
            elif index is not None and isinstance(node, list) and int(index) < len(node):
                found.append(node[int(index)])
            elif field is not None and isinstance(node, list):
                found += [
                    item for item in node if isinstance(item, dict) and item.get(field) == value
                ]
        nodes = found
    return nodes


def age(timestamp: str, now: datetime.datetime) -> str:
    """kubectl's short human duration: 5s, 3m, 2h, 4d."""
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cell(values: list[Any], kind: str, now: datetime.datetime) -> Any:
    if not values:
        return None
    if kind == "date":
        return age(str(values[0]), now)
    if len(values) > 1:
        return ",".join(str(value) for value in values)
    return values[0]


def table(
    objects: list[dict[str, Any]], columns: list[dict[str, Any]], version: str
) -> dict[str, Any]:
    """A meta.k8s.io Table of `objects`; `columns` are a CRD's additionalPrinterColumns."""
    now = datetime.datetime.now(datetime.UTC)
    if not columns:
        columns = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    definitions = [
        {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}
    ]
    definitions += [
        {
            "name": column["name"],
            "type": column.get("type", "string"),
            "format": column.get("format", ""),
            "description": column.get("description", ""),
            "priority": column.get("priority", 0),
        }
        for column in columns
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        cells += [
            _cell(jsonpath(obj, column["jsonPath"]), column.get("type", ""), now)
            for column in columns
        ]
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
        rows.append({"cells": cells, "object": partial})
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": {},
        "columnDefinitions": definitions,
        "rows": rows,
    }
