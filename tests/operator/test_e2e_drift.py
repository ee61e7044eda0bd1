"""End to end: children converge to exactly what carpool renders, and no further.

Server-side apply: a field carpool stops rendering leaves the child; a field carpool renders
and someone changed is put back; a field someone else added and carpool never renders (an
HPA's replicas, a mesh's injected container) stays theirs.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
from support.kube_cluster import OPERATOR_AGENT, Cluster
from support.kube_models import applied, model, wait_resyncs


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def model_server(deployment: dict[str, Any]) -> dict[str, Any]:
    (server,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == "model-server"]
    return dict(server)


PLACEMENT = {
    "nodeSelector": {"carpool.dev/pool": "gpu"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "inference",
    "serviceAccountName": "models",
}
MANAGED_BY = "app.kubernetes.io/managed-by"
PLACED = ("nodeSelector", "tolerations", "priorityClassName", "serviceAccountName")


def test_fields_removed_from_the_spec_leave_the_deployment(cluster: Cluster) -> None:
    env = [{"name": "HF_HOME", "value": "/tmp/hf"}]
    full = model("e2e-removed", **PLACEMENT)
    full["spec"]["model"]["env"] = env
    applied(cluster, full)

    def placed(found: dict[str, Any]) -> bool:
        pod = pod_spec(found)
        return all(key in pod for key in PLACED) and model_server(found).get("env") == env

    cluster.wait_for_object("deployment", "e2e-removed", placed)

    cluster.apply(model("e2e-removed"))

    def bare(found: dict[str, Any]) -> bool:
        pod = pod_spec(found)
        return not any(key in pod for key in PLACED) and "env" not in model_server(found)

    cluster.wait_for_object("deployment", "e2e-removed", bare)


def test_switching_weights_from_uri_to_pvc_drops_the_fetcher(cluster: Cluster) -> None:
    uri = {"uri": {"url": "https://models.example.com/model.pt"}}
    body = model("e2e-weights")
    body["spec"]["model"]["weights"] = uri
    applied(cluster, body)
    cluster.wait_for_object(
        "deployment", "e2e-weights", lambda found: "initContainers" in pod_spec(found)
    )

    body["spec"]["model"]["weights"] = {"pvc": {"claimName": "weights"}}
    cluster.apply(body)

    def switched(found: dict[str, Any]) -> bool:
        volumes = {v["name"]: v for v in pod_spec(found)["volumes"]}
        claim = volumes["weights"].get("persistentVolumeClaim", {})
        return (
            "initContainers" not in pod_spec(found)
            and "emptyDir" not in volumes["weights"]
            and claim.get("claimName") == "weights"
        )

    cluster.wait_for_object("deployment", "e2e-weights", switched)


def test_hand_added_host_network_is_repaired(cluster: Cluster) -> None:
    applied(cluster, model("e2e-host"))
    cluster.wait_for_object("deployment", "e2e-host")

    edit = {"spec": {"template": {"spec": {"hostNetwork": True}}}}
    cluster.kubectl("patch", "deployment", "e2e-host", "--type=merge", "-p", json.dumps(edit))
    cluster.wait_for_object(
        "deployment", "e2e-host", lambda found: not pod_spec(found).get("hostNetwork")
    )


@pytest.mark.parametrize("kind", ["deployment", "configmap"])
def test_a_removed_carpool_label_is_put_back(cluster: Cluster, kind: str) -> None:
    """The watches select carpool's label, so the child leaves the operator's view when it
    goes (the API server says DELETED); the operator still owns it and applies it again."""
    name = f"e2e-unlabelled-{kind}"
    applied(cluster, model(name))
    child = name if kind == "deployment" else f"{name}-batching"
    cluster.wait_for_object(kind, child)

    cluster.kubectl("label", kind, child, f"{MANAGED_BY}-")
    cluster.wait_for_object(
        kind, child, lambda found: found["metadata"]["labels"].get(MANAGED_BY) == "carpool"
    )


def test_fields_of_other_managers_are_left_alone(cluster: Cluster) -> None:
    applied(cluster, model("e2e-shared"))
    cluster.wait_for_object("deployment", "e2e-shared")

    # A mesh injecting its proxy into the pod template (a strategic merge by container name).
    proxy = {"name": "mesh-proxy", "image": "registry.example.com/mesh/proxy:1.0"}
    edit = {"spec": {"template": {"spec": {"containers": [proxy]}}}}
    cluster.kubectl("patch", "deployment", "e2e-shared", "-p", json.dumps(edit))
    wait_resyncs(cluster, count=3)
    found = cluster.get("deployment", "e2e-shared")
    assert found is not None
    names = [container["name"] for container in pod_spec(found)["containers"]]
    assert names == ["model-server", "sidecar", "mesh-proxy"]

    # Carpool's own fields inside the shared list are still carpool's.
    edit = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "x/y:1"}]}}}}
    cluster.kubectl("patch", "deployment", "e2e-shared", "-p", json.dumps(edit))

    def repaired(found: dict[str, Any]) -> bool:
        images = {c["name"]: c["image"] for c in pod_spec(found)["containers"]}
        return images["sidecar"] != "x/y:1" and "mesh-proxy" in images

    cluster.wait_for_object("deployment", "e2e-shared", repaired)
    if cluster.api is not None:
        # Repaired once, then quiet: the proxy is no drift.
        wait_resyncs(cluster, count=1)
        writes = cluster.api.write_count(agent=OPERATOR_AGENT, about="e2e-shared")
        wait_resyncs(cluster, count=3)
        assert cluster.api.write_count(agent=OPERATOR_AGENT, about="e2e-shared") == writes


def test_child_and_pod_watches_are_filtered_by_the_server(cluster: Cluster) -> None:
    if cluster.api is None:
        pytest.skip("a real API server does not show who asked for what")
    applied(cluster, model("e2e-watched"))
    cluster.kubectl("create", "configmap", "someone-elses", "--from-literal=a=b")
    collections = {"configmaps", "services", "deployments", "pods"}
    asked = [
        record
        for record in cluster.api.records
        if record.method == "GET"
        and record.path.rsplit("/", 1)[-1] in collections
        and not record.agent.startswith("kubectl")
    ]
    assert {record.path.rsplit("/", 1)[-1] for record in asked} == collections
    # Every list and watch names a label selector: nothing else is sent to the operator.
    for record in asked:
        selector = urllib.parse.parse_qs(record.query).get("labelSelector", [""])[0]
        # The cache's lists and watches select carpool's objects (docs/operator.md, RBAC).
        assert selector == "app.kubernetes.io/managed-by=carpool", record
