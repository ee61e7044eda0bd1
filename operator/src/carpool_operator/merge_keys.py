"""The lists Kubernetes merges by key, and the duplicate keys the API server refuses in them.

Server-side apply types each applied object against its kind's schema, and two items of a list
merged by key (`x-kubernetes-list-type: map`) with the same key make it refuse the whole apply,
with a 500 that no retry can fix (structured-merge-diff: "duplicate entries for key"). A spec
the CRD admits can cause that through what it copies into the pod: two `spec.model.env` of one
name, weights mounted at `/tmp` or `/run/carpool`, where carpool mounts its own volumes.
`refuse_duplicates` finds them in the rendered children before anything is sent, and names them
as the API server would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from carpool_operator.spec import SpecError
from carpool_operator.types import Manifest

# The keyed lists of the core/v1 and apps/v1 types carpool renders, by field name. `ports` are
# keyed by containerPort (a container's) or port (a Service's), and protocol.
_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
}
# A key field the API server defaults before it compares keys.
_DEFAULTS = {"protocol": "TCP"}


def _key_fields(field: str, item: Any) -> tuple[str, ...] | None:
    if not isinstance(item, dict):
        return None
    if field == "ports":
        return ("containerPort" if "containerPort" in item else "port", "protocol")
    return _KEYS.get(field)


def item_key(field: str, item: Any) -> tuple[Any, ...] | None:
    """The key of an item of the list `field`, or None if that list is not merged by key."""
    fields = _key_fields(field, item)
    if fields is None:
        return None
    return tuple(item.get(name, _DEFAULTS.get(name)) for name in fields)


def _element(field: str, index: int, item: Any) -> str:
    """An item as structured-merge-diff names it in a path: by its key, or by its index."""
    fields = _key_fields(field, item)
    if fields is None:
        return f"[{index}]"
    pairs = zip(fields, item_key(field, item) or (), strict=True)
    return "[" + ",".join(f"{name}={json.dumps(value)}" for name, value in pairs) + "]"


def _duplicates(node: Any, path: str, field: str) -> Iterator[str]:
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _duplicates(value, f"{path}.{name}", name)
    elif isinstance(node, list):
        seen: set[str] = set()
        for index, item in enumerate(node):
            element = _element(field, index, item)
            if element in seen:
                yield f"{path}: duplicate entries for key {element}"
            seen.add(element)
            yield from _duplicates(item, path + element, "")


def refuse_duplicates(manifests: list[Manifest]) -> None:
    """Raise SpecError (Rejected) if the API server would refuse one of `manifests` for a key
    that two items of a keyed list share."""
    found = [
        f"{manifest['kind']} {manifest['metadata']['name']}: {problem}"
        for manifest in manifests
        for problem in _duplicates(manifest, "", "")
    ]
    if found:
        raise SpecError("Rejected", "the API server would refuse " + "; ".join(found))
