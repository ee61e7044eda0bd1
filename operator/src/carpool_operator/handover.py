"""Handing a Deployment's replica count to an autoscaler without a dip to one pod.

carpool applies `spec.replicas` (server-side, forced) while it sets the count. Once an
autoscaler takes over (`spec.autoscaling.enabled` or `.external`) carpool stops rendering the
field; were carpool still its only manager, that apply would remove it and the API server would
default it to 1, scaling a running model down until the autoscaler acts. So, as the Kubernetes
docs advise (server-side apply, "Transferring ownership"), a field manager of its own first
applies the live count alone: it keeps the field through carpool's apply, and loses it, and
with it its managedFields entry, at the autoscaler's first write.

The hand-over is told (one `ReplicasHandedOver` event) only once carpool's apply without the
count has landed: from then on carpool no longer applies the field, so no later judgment hands
it over again. Until then the Deployment itself records how far it got: a judgment that finds
the hand-over manager already holding the count (the pass's apply was refused after the
hand-over, 409, and the child is judged again; or kopf retries the handler) writes nothing
more. Each Event posted is a new object, which the API server never merges with an identical
one (client-go's recorder counts repeats on the client's side): a second post would read as
a second hand-over in `kubectl describe`. So an event whose post failed after the apply
landed is not posted again: a lost event rather than a duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carpool_operator.kube import FIELD_MANAGER, ApiError, KubeClient
from carpool_operator.types import Manifest

HANDOVER_MANAGER = "carpool-handover"

# An event's reason and message.
News = tuple[str, str]


def applies_replicas(deployment: Mapping[str, Any], manager: str = FIELD_MANAGER) -> bool:
    """Whether `manager`'s server-side apply owns the live Deployment's spec.replicas."""
    for entry in deployment.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            fields = entry.get("fieldsV1") or {}
            return "f:replicas" in (fields.get("f:spec") or {})
    return False


def replicas_only(rendered: Manifest, replicas: int) -> Manifest:
    """The hand-over's applied configuration: the Deployment's identity and its count."""
    metadata = rendered["metadata"]
    return {
        "apiVersion": rendered["apiVersion"],
        "kind": rendered["kind"],
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
        "spec": {"replicas": replicas},
    }


async def hand_over_replicas(
    kube: KubeClient, actual: Manifest, rendered: Manifest
) -> tuple[Manifest, News | None]:
    """Before applying `rendered` over `actual`: if the apply would drop replicas carpool
    applied, give the live count to the hand-over manager first. Returns the child as it is
    left for that apply, and the event to post once that apply lands (None: no hand-over)."""
    if rendered["kind"] != "Deployment" or "replicas" in rendered["spec"]:
        return actual, None
    replicas = int(actual.get("spec", {}).get("replicas", 1))
    # Zero is left to fall to the default of one: an HPA never scales a target at zero.
    if replicas == 0 or not applies_replicas(actual):
        return actual, None
    name = rendered["metadata"]["name"]
    message = f"Deployment {name} keeps its {replicas} replicas until the autoscaler sets them"
    news = "ReplicasHandedOver", message
    # Handed over already, by a judgment whose apply was then refused: the hand-over manager
    # owns the field, so it holds the live count through carpool's apply.
    if applies_replicas(actual, HANDOVER_MANAGER):
        return actual, news
    try:
        # Not forced: a conflict means the autoscaler wrote a new count since the read, so
        # the field is already theirs.
        handed = await kube.apply(
            replicas_only(rendered, replicas), manager=HANDOVER_MANAGER, force=False
        )
    except ApiError as error:
        if error.status != 409:
            raise
        return actual, None
    return handed, news
