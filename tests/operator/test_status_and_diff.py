"""Conditions read off a Deployment, and the drift check that keeps resyncs write-free."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from support.kube_defaults import apply_builtin_defaults

from carpool_operator.defaults import Defaults
from carpool_operator.diff import contains
from carpool_operator.render import render
from carpool_operator.spec import SpecError, parse
from carpool_operator.status import merge_conditions, observe

EARLY = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
LATER = EARLY + datetime.timedelta(minutes=5)


def deployment(replicas: int = 2, ready: int = 0, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"generation": 4},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 4,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            **status,
        },
    }


def summary(found: dict[str, Any] | None, error: SpecError | None = None) -> dict[str, Any]:
    return {c.type: (c.status, c.reason) for c in observe(found, error).conditions}


def test_conditions_follow_the_rollout() -> None:
    assert summary(deployment(ready=2)) == {
        "Ready": (True, "ReplicasReady"),
        "Progressing": (False, "RolloutComplete"),
        "Degraded": (False, "AsExpected"),
    }
    assert summary(deployment(ready=1))["Ready"] == (False, "ReplicasNotReady")
    rolling = deployment(ready=2, updatedReplicas=1)
    assert summary(rolling)["Progressing"] == (True, "RollingOut")
    stale = deployment(ready=2)
    stale["metadata"]["generation"] = 5
    assert summary(stale)["Progressing"] == (True, "RollingOut")
    assert summary(None)["Ready"] == (False, "DeploymentMissing")
    assert summary(deployment(replicas=0))["Ready"] == (False, "ScaledToZero")


def test_degraded_names_the_cause() -> None:
    stuck = deployment(
        conditions=[
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
        ]
    )
    assert summary(stuck)["Degraded"] == (True, "ProgressDeadlineExceeded")
    quota = deployment(
        conditions=[{"type": "ReplicaFailure", "status": "True", "message": "quota"}]
    )
    assert summary(quota)["Degraded"] == (True, "ReplicaFailure")
    error = SpecError("InvalidHandler", "nope")
    assert summary(deployment(ready=2), error)["Degraded"] == (True, "InvalidHandler")
    # A spec that keeps the Deployment from being made: Ready says why, too. One that keeps
    # an update from it leaves Ready to the pods that still serve.
    assert summary(None, error)["Ready"] == (False, "InvalidHandler")
    assert summary(deployment(ready=2), error)["Ready"] == (True, "ReplicasReady")


def test_last_transition_time_moves_only_on_flips() -> None:
    first, flipped = merge_conditions([], observe(deployment(ready=0), None).conditions, 4, EARLY)
    assert {c.type for c in flipped} == {"Ready", "Progressing", "Degraded"}

    same, flipped = merge_conditions(first, observe(deployment(ready=1), None).conditions, 5, LATER)
    assert flipped == []
    assert [c["lastTransitionTime"] for c in same] == [c["lastTransitionTime"] for c in first]
    assert {c["observedGeneration"] for c in same} == {5}
    assert same[0]["message"] == "1/2 ready"

    ready, flipped = merge_conditions(same, observe(deployment(ready=2), None).conditions, 5, LATER)
    assert [c.type for c in flipped] == ["Ready"]
    assert ready[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert ready[1]["lastTransitionTime"] == first[1]["lastTransitionTime"]


def stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """What an API server returns for `manifest`: with its defaults and canonical quantities."""
    result = copy.deepcopy(manifest)
    apply_builtin_defaults(result["kind"], result)
    result["metadata"].update(uid="x", resourceVersion="7", generation=1)
    return result


def test_server_defaults_are_not_drift() -> None:
    body = {
        "metadata": {"name": "m", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"handler": "toy"}, "resources": {"cpu": "1000m", "memory": "1Gi"}},
    }
    for manifest in render(body):
        assert contains(stored(manifest), manifest), manifest["kind"]
        assert stored(manifest) != manifest  # the server did add something


def test_changes_to_our_fields_are_drift() -> None:
    body = {
        "metadata": {"name": "m", "namespace": "ml", "uid": "u"},
        "spec": {"model": {"handler": "toy"}},
    }
    wanted = {manifest["kind"]: manifest for manifest in render(body)}["Deployment"]
    actual = stored(wanted)
    actual["spec"]["template"]["spec"]["containers"][1]["image"] = "someone/else:1"
    assert not contains(actual, wanted)

    actual = stored(wanted)
    actual["spec"]["template"]["spec"]["volumes"].pop()
    assert not contains(actual, wanted)

    actual = stored(wanted)
    actual["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    assert not contains(actual, wanted)


def test_other_managers_items_and_dropped_zero_values_are_no_drift() -> None:
    body = {
        "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
        "spec": {"model": {"handler": "toy"}},
    }
    (desired,) = [m for m in render(body) if m["kind"] == "Deployment"]
    live = copy.deepcopy(desired)
    pod = live["spec"]["template"]["spec"]
    pod["containers"].append({"name": "mesh-proxy", "image": "mesh/proxy:1"})
    del pod["hostNetwork"]  # the API server leaves false out
    assert contains(live, desired)
    pod["hostNetwork"] = True
    assert not contains(live, desired)
    del pod["hostNetwork"]
    pod["containers"][1]["image"] = "x/y:1"  # carpool's sidecar, changed
    assert not contains(live, desired)


def test_an_autoscaler_scaling_up_leaves_the_model_ready() -> None:
    scaled_up = deployment(replicas=5, ready=2)
    ready = {c.type: c for c in observe(scaled_up, None, fewest=2).conditions}["Ready"]
    assert ready.status and ready.message == "2/5 ready"
    short = {c.type: c for c in observe(deployment(replicas=5, ready=1), None, fewest=2).conditions}
    assert not short["Ready"].status


@pytest.mark.parametrize(
    ("autoscaling", "fewest"),
    [({}, 3), ({"enabled": True, "minReplicas": 2}, 2), ({"external": True}, 1)],
)
def test_ready_waits_for_the_fewest_pods_the_model_is_meant_to_run(
    autoscaling: dict[str, Any], fewest: int
) -> None:
    """spec.replicas, the HPA's minimum, or, under an external scaler whose bounds carpool
    does not know, one pod."""
    body = {"metadata": {"name": "m"}, "spec": {"model": {"handler": "toy"}, "replicas": 3}}
    body["spec"]["autoscaling"] = autoscaling
    spec = parse(body, defaults=Defaults())
    assert spec.fewest_replicas == fewest

    def ready(count: int) -> bool:
        found = deployment(replicas=6, ready=count)
        conditions = observe(found, None, fewest=spec.fewest_replicas).conditions
        return {c.type: c.status for c in conditions}["Ready"]

    assert ready(fewest) and not ready(fewest - 1)


def test_a_pod_problem_is_degraded_with_its_reason() -> None:
    problem = ("ImagePullBackOff", "pod m-1, model-server: not found")
    degraded = {c.type: c for c in observe(deployment(), None, pods=problem).conditions}["Degraded"]
    assert (degraded.status, degraded.reason) == (True, "ImagePullBackOff")
