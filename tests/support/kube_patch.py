"""The three PATCH flavours of the Kubernetes API, on plain JSON data.

Strategic merge is approximated: lists of objects merge by a known key per field name (see
MERGE_KEYS), other lists are replaced, and the `$patch`/`$setElementOrder` directives that kubectl
sends are honoured or dropped. Real servers read the merge keys from each type's schema.
"""

from __future__ import annotations

import copy
from typing import Any

# field name -> the key that identifies an item of that list (from the core/v1 and apps/v1 types)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
}


class PatchError(ValueError):
    """A patch that cannot apply; `status` is the HTTP code a real server answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"bad JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(document: Any, parts: list[str]) -> Any:
    node = document
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return node


def _get(document: Any, parts: list[str]) -> Any:
    node = document
    for part in parts:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError) as error:
            raise PatchError(f"path /{'/'.join(parts)} does not exist") from error
    return node


def _add(document: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(document, parts), parts[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise PatchError(f"cannot add at /{'/'.join(parts)}")
    return document


def _remove(document: Any, parts: list[str]) -> Any:
    _get(document, parts)
    parent, last = _parent(document, parts), parts[-1]
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return document


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy and test."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations", status=400)
    document = copy.deepcopy(target)
    for operation in operations:
        op, parts = operation.get("op"), _pointer(operation.get("path", ""))
        if op == "add":
            document = _add(document, parts, copy.deepcopy(operation["value"]))
        elif op == "remove":
            document = _remove(document, parts)
        elif op == "replace":
            _get(document, parts)
            document = _add(_remove(document, parts), parts, copy.deepcopy(operation["value"]))
        elif op in ("move", "copy"):
            source = _pointer(operation["from"])
            value = copy.deepcopy(_get(document, source))
            if op == "move":
                document = _remove(document, source)
            document = _add(document, parts, value)
        elif op == "test":
            if _get(document, parts) != operation.get("value"):
                raise PatchError(f"test operation failed at {operation.get('path')}")
        else:
            raise PatchError(f"unknown JSON patch operation {op!r}", status=400)
    return document


def _merge_list(field: str, target: Any, patch: list[Any]) -> list[Any]:
    key = MERGE_KEYS.get(field)
    if key is None or not isinstance(target, list):
        return [item for item in copy.deepcopy(patch) if not _is_directive(item)]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [item for item in copy.deepcopy(patch) if not _is_directive(item)]
    result = [copy.deepcopy(item) for item in target]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            continue
        index = next((i for i, old in enumerate(result) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _is_directive(item: Any) -> bool:
    return isinstance(item, dict) and "$patch" in item and len(item) == 1


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder, $retainKeys, $deleteFromPrimitiveList: ordering hints
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result
