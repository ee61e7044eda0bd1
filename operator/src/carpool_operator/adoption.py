"""Children an earlier BatchedModel of the same name left behind, taken back.

`kubectl delete bm NAME --cascade=orphan` keeps the children and takes the model's owner
reference off them. Applied again, the model (another uid) finds its children's names taken;
it adopts a child its next server-side apply then owns (the rendered ownerReferences name the
new model) when carpool made the child for a model of this name and nobody controls it now.
A model deleted the usual way and applied again at once finds the deleted one's children
still there, controlled by it, until the garbage collector (which works in the background)
removes them: the new model waits for that. Anything else is someone else's: a NameConflict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carpool_operator.kube import FIELD_MANAGER
from carpool_operator.types import Manifest


def adoptable(child: Mapping[str, Any], rendered: Manifest) -> bool:
    """Whether `child`, found where `rendered` goes, is an orphan of a model of this name.

    It carries the labels carpool gives that model's children (managed-by carpool, the model's
    instance), carpool's field manager applied it, and no controller owns it.
    """
    metadata = child.get("metadata", {})
    labels = metadata.get("labels") or {}
    wanted = rendered["metadata"]["labels"]
    if any(labels.get(key) != value for key, value in wanted.items()):
        return False
    if any(reference.get("controller") for reference in metadata.get("ownerReferences") or []):
        return False
    managers = metadata.get("managedFields") or []
    return any(
        entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply"
        for entry in managers
    )


def collected(child: Mapping[str, Any], rendered: Manifest) -> bool:
    """Whether `child` is controlled by a deleted BatchedModel of the name that `rendered`'s
    owner has: a BatchedModel's name is unique in its namespace, so one with another uid is
    gone, and the garbage collector deletes what it controlled."""
    (owner,) = rendered["metadata"]["ownerReferences"]
    group = owner["apiVersion"].split("/")[0]
    return any(
        reference.get("controller")
        and reference.get("kind") == owner["kind"]
        and str(reference.get("apiVersion", "")).split("/")[0] == group
        and reference.get("name") == owner["name"]
        and reference.get("uid") != owner["uid"]
        for reference in child.get("metadata", {}).get("ownerReferences") or []
    )
