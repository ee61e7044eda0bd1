"""Server-side apply and field ownership (`metadata.managedFields`), after the Kubernetes docs.

Every write records which field manager owns which fields:

- an apply (`PATCH` with `application/apply-patch+yaml`) by manager M makes M own exactly the
  fields of the applied configuration; fields M owned before and no longer applies are removed
  from the object unless another manager owns them; a field another manager owns with a
  different value is a 409 conflict unless `force=true`, which moves its ownership to M;
- any other write (create, update, merge/JSON/strategic patch) gives its manager the fields it
  changed and takes them away from everyone else (updates never conflict); a write through the
  `/scale` subresource is such an update of `spec.replicas`, its entry marked `subresource`.

Lists merge as the Kubernetes types declare them: associative lists by their map keys
(LIST_KEYS, as in the core/v1 and apps/v1 types), every other list is atomic (owned and replaced
whole), maps merge key by key. Field sets are kept as sets of paths; `fieldsV1` is written in
the API server's format (`f:name`, `k:{"name":"x"}`, `.` for a node that is itself owned).
Simplified: a node's membership is implied by any owned child, so `.` is not compared; lists
of scalars are atomic (no `v:` sets); no per-version conversion of field sets.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]
Path = tuple[str, ...]

# list field name -> the keys of one item, or None for an atomic list.
LIST_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "envFrom": (),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "podMetricsEndpoints": (),
}
# Fields that belong to the API server, never to a field manager.
_UNOWNED_METADATA = {
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
}  # fmt: skip
_UNOWNED_TOP = {"apiVersion", "kind", "status"}


class ApplyConflict(Exception):
    """Fields another manager owns with other values; `conflicts` are (manager, path text)."""

    def __init__(self, conflicts: list[tuple[str, str]]) -> None:
        super().__init__(f"{len(conflicts)} conflicts")
        self.conflicts = conflicts


def _item_keys(field: str, item: Any) -> tuple[str, ...] | None:
    if field == "ports" and isinstance(item, dict):
        # Container ports are keyed by containerPort and protocol, Service ports by port.
        first = "containerPort" if "containerPort" in item else "port"
        return (first, "protocol")
    keys = LIST_KEYS.get(field)
    return keys or None


def _key_segment(keys: tuple[str, ...], item: Json) -> str:
    # protocol defaults to TCP before the key is taken, as the API server's defaulting does.
    values = {key: item.get(key, "TCP" if key == "protocol" else None) for key in keys}
    return "k:" + json.dumps(values, separators=(",", ":"), sort_keys=True)


def _keyed(field: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value:
        return None
    keys = _item_keys(field, value[0])
    if keys is None or not all(isinstance(item, dict) for item in value):
        return None
    return keys


def field_paths(obj: Json) -> set[Path]:
    """Every owned node of an object: maps key by key, keyed list items by key, leaves."""
    paths: set[Path] = set()

    def walk(node: Any, path: Path, field: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, (*path, f"f:{key}"), key)
            return
        keys = _keyed(field, node)
        if keys is not None:
            for item in node:
                walk(item, (*path, _key_segment(keys, item)), "")
            paths.add(path)
            return
        paths.add(path)

    for key, value in obj.items():
        if key in _UNOWNED_TOP:
            continue
        if key == "metadata" and isinstance(value, dict):
            for meta_key, meta_value in value.items():
                if meta_key not in _UNOWNED_METADATA:
                    walk(meta_value, ("f:metadata", f"f:{meta_key}"), meta_key)
            continue
        walk(value, (f"f:{key}",), key)
    return {path for path in paths if path}


def _child(node: Any, segment: str) -> Any:
    """The value at one path segment, or a sentinel when absent."""
    if segment.startswith("f:") and isinstance(node, dict):
        return node.get(segment[2:], _ABSENT)
    if segment.startswith("k:") and isinstance(node, list):
        wanted = json.loads(segment[2:])
        for item in node:
            if isinstance(item, dict) and _key_segment(tuple(wanted), item) == segment:
                return item
    return _ABSENT


class _Absent:
    pass


_ABSENT = _Absent()


def value_at(obj: Any, path: Path) -> Any:
    node = obj
    for segment in path:
        node = _child(node, segment)
        if node is _ABSENT:
            break
    return node


def _remove(obj: Any, path: Path) -> None:
    parent = value_at(obj, path[:-1])
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(parent, list):
        target = _child(parent, last)
        parent[:] = [item for item in parent if item is not target]


def merge(live: Any, applied: Any, field: str = "") -> Any:
    """An applied configuration over a live object: maps by key, keyed lists by item key."""
    if isinstance(applied, dict) and isinstance(live, dict):
        result = dict(live)
        for key, value in applied.items():
            result[key] = merge(live.get(key), value, key)
        return result
    keys = _keyed(field, applied)
    if keys is not None and isinstance(live, list):
        result_list = [copy.deepcopy(item) for item in live]
        for item in applied:
            segment = _key_segment(keys, item)
            index = next(
                (i for i, old in enumerate(result_list)
                 if isinstance(old, dict) and _key_segment(keys, old) == segment),
                None,
            )  # fmt: skip
            if index is None:
                result_list.append(copy.deepcopy(item))
            else:
                result_list[index] = merge(result_list[index], item)
        return result_list
    return copy.deepcopy(applied)


def _under(path: Path, prefix: Path) -> bool:
    return path[: len(prefix)] == prefix


def _entries(obj: Json) -> list[Json]:
    return list(obj.get("metadata", {}).get("managedFields") or [])


def owned(entry: Json) -> set[Path]:
    """The paths of one managedFields entry's fieldsV1."""
    paths: set[Path] = set()

    def walk(tree: Json, path: Path) -> None:
        for segment, sub in tree.items():
            if segment == ".":
                paths.add(path)
                continue
            if isinstance(sub, dict) and sub:
                walk(sub, (*path, segment))
            else:
                paths.add((*path, segment))

    walk(entry.get("fieldsV1") or {}, ())
    return {path for path in paths if path}


def fields_v1(paths: Iterable[Path]) -> Json:
    tree: Json = {}
    for path in sorted(paths):
        node = tree
        for segment in path:
            node = node.setdefault(segment, {})

    def mark(node: Json) -> None:
        for segment, sub in node.items():
            if sub:
                mark(sub)
                if segment.startswith("k:"):
                    sub.setdefault(".", {})

    mark(tree)
    return tree


def _leaves(paths: set[Path]) -> set[Path]:
    return {p for p in paths if not any(len(q) > len(p) and _under(q, p) for q in paths)}


def _entry(manager: str, operation: str, api_version: str, paths: set[Path]) -> Json:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(paths),
    }


def _store(obj: Json, entries: list[Json]) -> None:
    kept = [entry for entry in entries if entry.get("fieldsV1")]
    obj.setdefault("metadata", {})["managedFields"] = kept


def apply(live: Json, applied: Json, manager: str, *, force: bool) -> Json:
    """The object after `manager` applied `applied` to `live`, with managedFields updated."""
    entries = _entries(live)
    mine = next((e for e in entries if e["manager"] == manager and e["operation"] == "Apply"), None)
    before = owned(mine) if mine else set()
    wanted = field_paths(applied)
    others = [e for e in entries if e is not mine]
    conflicts: list[tuple[str, str]] = []
    taken: set[Path] = set()
    for leaf in _leaves(wanted):
        for entry in others:
            theirs = owned(entry)
            if leaf in theirs and value_at(live, leaf) != value_at(applied, leaf):
                conflicts.append((entry["manager"], ".".join(s[2:] for s in leaf)))
                taken.add(leaf)
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    result = merge(copy.deepcopy(live), applied)
    remaining: list[Json] = []
    for entry in others:
        theirs = {p for p in owned(entry) if not any(_under(p, t) for t in taken)}
        remaining.append({**entry, "fieldsV1": fields_v1(theirs)})
    kept_by_others = set().union(*(owned(e) for e in remaining)) if remaining else set()
    # A field no longer applied goes, and with it every map or item left holding nothing
    # anyone owns; longest first, so that an item's fields go before the item.
    kept = kept_by_others | wanted
    dropped = {path[:end] for path in before - wanted for end in range(1, len(path) + 1)}
    for path in sorted(dropped, key=len, reverse=True):
        if not any(_under(p, path) for p in kept):
            _remove(result, path)
    api_version = str(applied.get("apiVersion", live.get("apiVersion", "")))
    _store(result, [*remaining, _entry(manager, "Apply", api_version, wanted)])
    return result


def _changed(old: Json, new: Json) -> tuple[set[Path], set[Path]]:
    """Leaf paths set or changed by a write, and paths it removed."""
    new_paths, old_paths = field_paths(new), field_paths(old)
    changed = {p for p in _leaves(new_paths) if value_at(old, p) != value_at(new, p)}
    removed = old_paths - new_paths
    return changed, removed


def update(old: Json | None, new: Json, manager: str, *, subresource: str = "") -> Json:
    """`new` with managedFields after an ordinary write by `manager` (old None: a create).

    A write through a subresource (`scale`) is its manager's own entry, marked with it.
    """
    entries = _entries(old) if old is not None else []
    if old is None:
        changed, removed = field_paths(new), set()
    else:
        changed, removed = _changed(old, new)
    if not changed and not removed:
        _store(new, entries)
        return new
    result: list[Json] = []
    mine: set[Path] = set()
    for entry in entries:
        paths = {p for p in owned(entry) if not any(_under(p, c) for c in changed | removed)}
        same = (entry["manager"], entry["operation"], entry.get("subresource", ""))
        if same == (manager, "Update", subresource):
            mine = paths
            continue
        result.append({**entry, "fieldsV1": fields_v1(paths)})
    api_version = str(new.get("apiVersion", ""))
    written = _entry(manager, "Update", api_version, mine | changed)
    if subresource:
        written["subresource"] = subresource
    result.append(written)
    _store(new, result)
    return new
