"""Handing a Deployment's replica count to an autoscaler without a dip to one pod.

carpool applies `spec.replicas` (server-side, forced) while it sets the count. Once an
autoscaler takes over (`spec.autoscaling.enabled` or `.external`) carpool stops rendering the
field; were carpool still its only manager, that apply would remove it and the API server would
default it to 1, scaling a running model down until the autoscaler acts. So, as the Kubernetes
docs advise (server-side apply, "Transferring ownership"), a field manager of its own first
applies the live count alone: it keeps the field through carpool's apply, and loses it, and
with it its managedFields entry, at the autoscaler's first write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carpool_operator.kube import FIELD_MANAGER, ApiError, KubeClient
from carpool_operator.types import Manifest

HANDOVER_MANAGER = "carpool-handover"


def applies_replicas(deployment: Mapping[str, Any]) -> bool:
    """Whether carpool's server-side apply owns the live Deployment's spec.replicas."""
    for entry in deployment.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
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
    kube: KubeClient, owner: Manifest, actual: Manifest, rendered: Manifest
) -> Manifest:
    """Before applying `rendered` over `actual`: if the apply would drop replicas carpool
    applied, give the live count to the hand-over manager first. Returns the child as it is
    left for that apply."""
    if rendered["kind"] != "Deployment" or "replicas" in rendered["spec"]:
        return actual
    replicas = int(actual.get("spec", {}).get("replicas", 1))
    # Zero is left to fall to the default of one: an HPA never scales a target at zero.
    if replicas == 0 or not applies_replicas(actual):
        return actual
    try:
        # Not forced: a conflict means the autoscaler wrote a new count since the read, so
        # the field is already theirs.
        handed = await kube.apply(
            replicas_only(rendered, replicas), manager=HANDOVER_MANAGER, force=False
        )
    except ApiError as error:
        if error.status != 409:
            raise
        return actual
    name = rendered["metadata"]["name"]
    message = f"Deployment {name} keeps its {replicas} replicas until the autoscaler sets them"
    await kube.post_event(owner, "ReplicasHandedOver", message, warning=False)
    return handed
