"""What must still hold when a child's write lands: the child and its model as judged.

A reconcile judges a child from the cache, and the cache may be behind the API server (each
kind has its own watch). `kubectl delete bm NAME --cascade=orphan` makes the garbage collector
take the model's owner reference off each child, then the model goes; a write that put the
reference back afterwards would hand the child to the collector, which deletes a dependent
whose owner is gone: the children the user asked to keep. Two checks close that:

- every apply over an existing child names the resourceVersion the child was judged at, and
  every delete of a child the spec dropped names it and the uid as preconditions, so the API
  server refuses either (409 Conflict; the child is judged again as the API server has it) if
  anything wrote the child since, such as the collector taking the reference off;
- a child found without this model's reference is adopted only after the model itself is read
  from the API server, past the cache, alive (no deletionTimestamp) and the same object: the
  children's watches may have told of an orphaning before the model's watch told of its
  deletion. Kubernetes' own controllers recheck an owner before adopting for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carpool_operator.kube import KubeClient
from carpool_operator.types import Manifest


class ModelGone(Exception):
    """The BatchedModel went, or is going, since the reconcile read it: nothing more is
    written for it, and the garbage collector sees to its children."""


async def require_live(kube: KubeClient, model: Manifest) -> None:
    """Raise ModelGone unless `model` is, on the API server now, itself and not deleting."""
    metadata = model["metadata"]
    now = await kube.fetch(model["kind"], metadata["namespace"], metadata["name"])
    if now is None:
        raise ModelGone(f"{metadata['name']} is gone")
    if now["metadata"].get("uid") != metadata.get("uid"):
        raise ModelGone(f"{metadata['name']} was deleted and made again")
    if now["metadata"].get("deletionTimestamp"):
        raise ModelGone(f"{metadata['name']} is being deleted")


def as_judged(manifest: Manifest, child: Mapping[str, Any] | None) -> Manifest:
    """`manifest` to apply over `child` (None: there is none yet), the precondition that it
    has not changed since added."""
    if child is None:
        return manifest
    version = child["metadata"]["resourceVersion"]
    return {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": version}}
