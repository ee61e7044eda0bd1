"""End to end: a spec the CRD admits but whose children the API server refuses.

The CRD keeps some parts free-form (affinity, env valueFrom) and cannot see collisions with
what carpool renders (two env variables of one name, weights mounted where carpool mounts
something). Server-side apply refuses such a child with a 500 that no retry can fix; the model
must say so at once, as Rejected with the API server's words, and the operator must not keep
sending it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.kube_cluster import OPERATOR_AGENT, Cluster
from support.kube_models import applied, condition, degraded, model, wait_resyncs

from carpool.contract.pod import SOCKET_DIR

# "Within seconds": the operator resyncs every second here; kopf reacts to the create at once.
PROMPTLY_S = 10.0


def children_path(cluster: Cluster, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/{name}"


def quiet_after(cluster: Cluster, name: str) -> None:
    """The operator writes nothing about `name` over three resyncs: no retry, no event."""
    if cluster.api is None:
        return
    # The pass that reported the rejection may still be posting its event and kopf's marks.
    wait_resyncs(cluster, count=1)
    writes = cluster.api.write_count(agent=OPERATOR_AGENT, about=name)
    wait_resyncs(cluster, count=3)
    assert cluster.api.write_count(agent=OPERATOR_AGENT, about=name) == writes


def test_a_child_the_api_server_refuses_is_rejected_at_once(cluster: Cluster) -> None:
    """A misspelt field under the free-form affinity: the API server cannot type the Deployment."""
    term = {"matchExpresions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
    required = {"nodeSelectorTerms": [term]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    cluster.apply(model("e2e-typo", affinity=affinity))

    found = degraded(cluster, "e2e-typo", "Rejected", timeout=PROMPTLY_S)
    message = condition(found, "Degraded")["message"]
    assert "Deployment e2e-typo" in message
    assert "nodeSelectorTerms[0].matchExpresions: field not declared in schema" in message
    assert condition(found, "Ready")["status"] == "False"
    assert condition(found, "Ready")["reason"] == "Rejected"
    quiet_after(cluster, "e2e-typo")
    if cluster.api is not None:  # sent once, refused once
        path = children_path(cluster, "e2e-typo")
        assert cluster.api.request_count("PATCH", path, agent=OPERATOR_AGENT) == 1

    # Fixing the spec brings the model up.
    term["matchExpressions"] = term.pop("matchExpresions")
    cluster.kubectl(
        "patch", "bm", "e2e-typo", "--type=merge",
        "-p", json.dumps({"spec": {"affinity": affinity}}),
    )  # fmt: skip
    cluster.wait_for_object("deployment", "e2e-typo")
    cluster.wait_for_object(
        "bm", "e2e-typo", lambda found: condition(found, "Degraded").get("status") == "False"
    )


def test_a_refused_child_is_sent_again_once_it_changed(cluster: Cluster) -> None:
    """A refusal answers a manifest sent against the child as it was. An update refused (by an
    admission policy, say), then the child deleted, as one does to have it made anew: the
    operator makes it at the deletion's watch event, as it restores any deleted child."""
    if cluster.api is None:
        pytest.skip("the refusal is injected at the test API server")
    name = "e2e-refused-update"
    applied(cluster, model(name))
    cluster.wait_for_object("deployment", name)
    cluster.api.fail("PATCH", children_path(cluster, name), code=422)
    cluster.apply(model(name, replicas=2))
    degraded(cluster, name, "Rejected", timeout=PROMPTLY_S)

    cluster.kubectl("delete", "deployment", name)
    cluster.wait_for_object("deployment", name, lambda found: found["spec"]["replicas"] == 2)
    cluster.wait_for_object(
        "bm", name, lambda found: condition(found, "Degraded").get("status") == "False"
    )


def _with_model(name: str, **fields: Any) -> dict[str, Any]:
    body = model(name)
    body["spec"]["model"].update(fields)
    return body


DUPLICATES = {
    "env-named-twice": (
        _with_model("e2e-env-twice", env=[{"name": "LEVEL", "value": "a"}, {"name": "LEVEL"}]),
        '.env: duplicate entries for key [name="LEVEL"]',
    ),
    "weights-on-tmp": (
        _with_model("e2e-on-tmp", weights={"pvc": {"claimName": "w", "mountPath": "/tmp"}}),
        '.volumeMounts: duplicate entries for key [mountPath="/tmp"]',
    ),
    "weights-on-the-socket": (
        _with_model("e2e-on-socket", weights={"pvc": {"claimName": "w", "mountPath": SOCKET_DIR}}),
        f'.volumeMounts: duplicate entries for key [mountPath="{SOCKET_DIR}"]',
    ),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_collision_in_a_keyed_list_is_rejected_before_any_apply(
    cluster: Cluster, case: str
) -> None:
    body, error = DUPLICATES[case]
    name = body["metadata"]["name"]
    cluster.apply(body)

    found = degraded(cluster, name, "Rejected", timeout=PROMPTLY_S)
    message = condition(found, "Degraded")["message"]
    assert f'Deployment {name}: .spec.template.spec.containers[name="model-server"]' in message
    assert error in message
    quiet_after(cluster, name)
    # Nothing half made: the collision was found before any child was sent.
    assert cluster.get("configmap", f"{name}-batching") is None
    if cluster.api is not None:
        assert cluster.api.request_count("PATCH", children_path(cluster, name)) == 0
