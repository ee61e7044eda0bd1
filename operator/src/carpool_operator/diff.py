"""Does a live object already hold what we render? Only fields we set count.

The API server adds defaults (a Service's clusterIP, a probe's scheme, a container's
terminationMessagePath), leaves out zero values (`hostNetwork: false`) and rewrites quantities
("1000m" becomes "1", "0.0001" "100u"; see quantity.py); none of that is drift. Other field
managers may add items to the lists that Kubernetes merges by key (an injected container, an
extra port); that is theirs, not drift either. Anything we render that differs, or is
missing, is.

What `contains` cannot see, a field we rendered before and no longer render, the digest
annotation catches: it changes whenever the rendered manifest does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from carpool_operator.merge_keys import item_key
from carpool_operator.names import DOMAIN
from carpool_operator.quantity import canonical
from carpool_operator.types import Manifest

# On every child: the digest of the manifest last applied (see `digest`).
APPLIED_ANNOTATION = f"{DOMAIN}/applied-digest"

# Where resource quantities live, which the API server canonicalises.
_QUANTITY_MAPS = {"limits", "requests"}
_QUANTITY_KEYS = {"averageValue"}


def _same_scalar(actual: Any, desired: Any, is_quantity: bool) -> bool:
    if actual == desired and type(actual) is type(desired):
        return True
    if is_quantity and isinstance(actual, str | int) and isinstance(desired, str):
        stored = canonical(desired)
        return stored is not None and canonical(str(actual)) == stored
    return False


def _zero(value: Any) -> bool:
    return value is False or value == 0 or value in ("", {}, [])


def _contains_list(actual: Any, desired: list[Any], key: str, parent: str) -> bool:
    if not isinstance(actual, list):
        return False
    if desired and all(item_key(key, item) is not None for item in desired):
        # Merged by key: each of our items must be there; others' items may be too.
        found = {item_key(key, item): item for item in actual}
        return all(contains(found.get(item_key(key, item)), item, "", key) for item in desired)
    # Atomic: ours whole, same length, each item containing ours in order.
    if len(actual) != len(desired):
        return False
    return all(contains(a, d, key, parent) for a, d in zip(actual, desired, strict=True))


def contains(actual: Any, desired: Any, key: str = "", parent: str = "") -> bool:
    """True when every field of `desired` is in `actual` with the same value."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        return all(
            contains(actual[name], value, name, key) if name in actual else _zero(value)
            for name, value in desired.items()
        )
    if isinstance(desired, list):
        return _contains_list(actual, desired, key, parent)
    is_quantity = parent in _QUANTITY_MAPS or key in _QUANTITY_KEYS
    return _same_scalar(actual, desired, is_quantity)


def digest(manifest: Manifest) -> str:
    """A short, stable fingerprint of a rendered manifest."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_digest(manifest: Manifest) -> Manifest:
    """The manifest, its digest annotated on it."""
    metadata = dict(manifest["metadata"])
    metadata["annotations"] = {
        **metadata.get("annotations", {}),
        APPLIED_ANNOTATION: digest(manifest),
    }
    return {**manifest, "metadata": metadata}


def up_to_date(actual: Manifest, desired: Manifest) -> bool:
    """Whether `actual` holds `desired` (as annotated by `with_digest`) and nothing we dropped."""
    annotations = actual.get("metadata", {}).get("annotations") or {}
    wanted = desired["metadata"]["annotations"][APPLIED_ANNOTATION]
    return annotations.get(APPLIED_ANNOTATION) == wanted and contains(actual, desired)
