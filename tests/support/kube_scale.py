"""The `/scale` subresource (autoscaling/v1 Scale), through which HPAs and `kubectl scale` write.

A Scale shows one number of its parent, `spec.replicas`, with the parent's identity and, in
its status, the replicas observed and the pod selector as a string. A write through it is an
ordinary update of the parent's `spec.replicas` by the writing manager: it takes the field from
every other manager, and the API server records it as an `Update` entry marked `subresource:
scale` (apimachinery's managedfields.ScaleHandler).
"""

from __future__ import annotations

import copy
from typing import Any

Json = dict[str, Any]
SUBRESOURCE = "scale"
API_VERSION = "autoscaling/v1"


def _selector(obj: Json) -> str:
    labels = obj.get("spec", {}).get("selector", {}).get("matchLabels", {})
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def scale_of(obj: Json) -> Json:
    """The Scale a parent object shows."""
    metadata = obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Scale",
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in metadata
        },
        "spec": {"replicas": obj.get("spec", {}).get("replicas", 0)},
        "status": {
            "replicas": obj.get("status", {}).get("replicas", 0),
            "selector": _selector(obj),
        },
    }


def replicas_of(scale: Any) -> int | None:
    """The replicas a written Scale asks for; None when it asks for no valid count."""
    if not isinstance(scale, dict):
        return None
    replicas = scale.get("spec", {}).get("replicas", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        return None
    return replicas


def scaled(obj: Json, scale: Json, replicas: int) -> Json:
    """The parent after a Scale write: its replicas, and the Scale's resourceVersion as the
    precondition of the write (an HPA sends the version it read)."""
    parent = copy.deepcopy(obj)
    parent.setdefault("spec", {})["replicas"] = replicas
    version = scale.get("metadata", {}).get("resourceVersion")
    if version:
        parent["metadata"]["resourceVersion"] = version
    else:
        parent["metadata"].pop("resourceVersion", None)
    return parent
