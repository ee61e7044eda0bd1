"""A BatchedModel's status, read off its Deployment and spent as conditions.

Pure functions: the handler fetches the Deployment, these say what the status should be and
which conditions flipped (each flip becomes a Kubernetes event).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from carpool_operator.spec import SpecError
from carpool_operator.types import Manifest

ConditionType = Literal["Ready", "Progressing", "Degraded", "Autoscaling", "Monitoring"]


@dataclass(frozen=True)
class Condition:
    type: ConditionType
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    desired: int
    ready: int
    conditions: tuple[Condition, ...]


def _deployment_condition(deployment: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in deployment.get("status", {}).get("conditions", []):
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def observe(
    deployment: Mapping[str, Any] | None,
    error: SpecError | None,
    *,
    pods: tuple[str, str] | None = None,
    fewest: int | None = None,
) -> Observation:
    """Ready, Progressing and Degraded for a Deployment (None: not created yet).

    `pods`: the pods' most telling problem (see pods.pod_problem). `fewest`: the replicas that
    make the model Ready (ModelSpec.fewest_replicas; under an autoscaler its minimum), so that
    scaling up, which adds pods that are not ready yet, never flips Ready.
    """
    found = deployment or {}
    spec, status = found.get("spec", {}), found.get("status", {})
    desired = int(spec.get("replicas", 1)) if deployment is not None else 0
    ready = int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    total = int(status.get("replicas", 0))
    stale = int(status.get("observedGeneration", 0)) < int(
        found.get("metadata", {}).get("generation", 0)
    )

    if deployment is None and error is not None:  # what keeps the Deployment from being made
        ready_condition = Condition("Ready", False, error.reason, error.message)
    elif deployment is None:
        ready_condition = Condition("Ready", False, "DeploymentMissing", "no Deployment yet")
    elif desired == 0:
        ready_condition = Condition("Ready", False, "ScaledToZero", "0 replicas desired")
    elif ready >= min(desired, fewest or desired):
        ready_condition = Condition("Ready", True, "ReplicasReady", f"{ready}/{desired} ready")
    else:
        ready_condition = Condition("Ready", False, "ReplicasNotReady", f"{ready}/{desired} ready")

    if deployment is not None and (stale or updated < desired or total > updated):
        message = f"{updated} of {desired} replicas updated"
        progressing = Condition("Progressing", True, "RollingOut", message)
    else:
        progressing = Condition("Progressing", False, "RolloutComplete", "no rollout under way")

    deadline = _deployment_condition(found, "Progressing")
    failure = _deployment_condition(found, "ReplicaFailure")
    if error is not None:
        degraded = Condition("Degraded", True, error.reason, error.message)
    elif pods is not None:
        degraded = Condition("Degraded", True, *pods)
    elif deadline.get("reason") == "ProgressDeadlineExceeded":
        message = str(deadline.get("message", "the rollout stalled"))
        degraded = Condition("Degraded", True, "ProgressDeadlineExceeded", message)
    elif failure.get("status") == "True":
        message = str(failure.get("message", "pods cannot be created"))
        degraded = Condition("Degraded", True, "ReplicaFailure", message)
    else:
        degraded = Condition("Degraded", False, "AsExpected", "nothing wrong observed")
    return Observation(desired, ready, (ready_condition, progressing, degraded))


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    observed: Sequence[Condition],
    generation: int,
    now: datetime.datetime,
) -> tuple[list[Manifest], list[Condition]]:
    """The new conditions list and the conditions whose status flipped (or appeared)."""
    before = {str(item.get("type")): item for item in previous}
    merged: list[Manifest] = []
    flipped: list[Condition] = []
    for condition in observed:
        status = "True" if condition.status else "False"
        old = before.get(condition.type, {})
        if old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
        else:
            since = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            flipped.append(condition)
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "observedGeneration": generation,
                "lastTransitionTime": since,
            }
        )
    return merged, flipped


def desired_status(
    observation: Observation,
    conditions: list[Manifest],
    *,
    generation: int,
    url: str,
    batching: Mapping[str, float | str] | None,
) -> Manifest:
    """The status to write; `batching` None leaves `status.batching` as it is."""
    status: Manifest = {
        "observedGeneration": generation,
        "replicas": observation.desired,
        "readyReplicas": observation.ready,
        "replicasReady": f"{observation.ready}/{observation.desired}",
        "url": url,
        "conditions": conditions,
    }
    if batching is not None:
        status["batching"] = dict(batching)
    return status
