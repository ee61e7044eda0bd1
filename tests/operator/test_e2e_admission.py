"""End to end: a spec that cannot run is refused at admission, or reported Degraded with why.

Admission: the CRD's CEL rules (kubectl shows their messages). What CEL cannot know (a Secret
that is missing, an image that does not exist, a handler that does not import, a pod no node
takes) the operator reports as Degraded with a specific reason, within 60 s. On the test API
server no kubelet runs, so the tests write the pod status a kubelet would.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.kube_cluster import Cluster
from support.kube_models import applied, condition, degraded, model, wait_resyncs

from carpool.contract.pod import LOAD_FAILED


def gpu_model(name: str, device: str, gpu: int, **model_fields: Any) -> dict[str, Any]:
    body = model(name, resources={"cpu": "500m", "gpu": gpu})
    body["spec"]["model"].update(device=device, **model_fields)
    return body


REFUSED = {
    "name-starts-with-digit": (model("1model"), "must be a DNS-1035 label"),
    "name-with-dot": (model("my.model"), "must be a DNS-1035 label"),
    "name-too-long": (model("m" * 64), "at most 52 characters"),
    "cuda-without-gpu": (gpu_model("cuda-no-gpu", "cuda:0", 0), "needs resources.gpu"),
    "second-gpu": (gpu_model("cuda-one", "cuda:1", 1), "use cuda:0"),
    "fp16-on-cpu": (gpu_model("half-cpu", "cpu", 0, dtype="fp16"), "fp16 needs a GPU"),
    "two-gpus": (gpu_model("two-gpus", "cuda:0", 2), "one GPU per pod"),
    "huge-model-batch": (
        gpu_model("huge-batch", "cpu", 0, maxBatchSize=1024),
        "cannot be warmed up",
    ),
    "two-autoscalers": (
        model("two-scalers", autoscaling={"enabled": True, "external": True}),
        'spec.autoscaling.external: Invalid value: "object": enabled and external exclude',
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unrunnable_specs_are_refused_with_a_reason(cluster: Cluster, case: str) -> None:
    body, message = REFUSED[case]
    result = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body), check=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert cluster.get("bm", body["metadata"]["name"][:63]) is None


def test_a_missing_secret_is_degraded_until_it_exists(cluster: Cluster) -> None:
    """The operator reads no Secret: the kubelet's report on the pods says one is missing."""
    body = model("e2e-secret")
    reference = {"secretKeyRef": {"name": "e2e-token", "key": "token"}}
    body["spec"]["model"]["env"] = [{"name": "TOKEN", "valueFrom": reference}]
    applied(cluster, body)
    cluster.wait_for_object("deployment", "e2e-secret")
    missing = waiting("CreateContainerConfigError", 'secret "e2e-token" not found')
    kubelet_reports(cluster, "e2e-secret", {"containerStatuses": [missing]})
    found = degraded(cluster, "e2e-secret", "SecretNotFound")
    assert 'secret "e2e-token" not found' in condition(found, "Degraded")["message"]

    cluster.kubectl("create", "secret", "generic", "e2e-token", "--from-literal=token=x")
    running = {"name": "model-server", "state": {"running": {}}}
    kubelet_reports(cluster, "e2e-secret", {"containerStatuses": [running]})
    cluster.wait_for_object(
        "bm", "e2e-secret", lambda found: condition(found, "Degraded")["status"] == "False"
    )
    assert cluster.api is not None  # kubelet_reports skipped the test on a real cluster
    operator = ("carpool-operator", "kopf")
    asked = [r.path for r in cluster.api.records if r.agent.startswith(operator)]
    assert not [path for path in asked if "/secrets" in path]


def kubelet_reports(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    """A pod of the model with this status, as the ReplicaSet and the kubelet would make it."""
    if cluster.api is None:
        pytest.skip("a real cluster's kubelet reports pods itself")
    labels = {
        "app.kubernetes.io/name": "batchedmodel",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "model",
        "app.kubernetes.io/managed-by": "carpool",
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-7c9f8d-x2v4q", "labels": labels},
        "spec": {"containers": [{"name": "model-server", "image": "x"}]},
    }
    cluster.apply(pod)
    cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"name": "model-server", "state": {"waiting": {"reason": reason, "message": message}}}


def test_an_image_that_does_not_exist_is_degraded(cluster: Cluster) -> None:
    applied(cluster, model("e2e-pull", model={"handler": "toy", "image": "example.invalid/no:1"}))
    pull = waiting("ImagePullBackOff", 'Back-off pulling image "example.invalid/no:1"')
    kubelet_reports(cluster, "e2e-pull", {"containerStatuses": [pull]})
    found = degraded(cluster, "e2e-pull", "ImagePullBackOff")
    assert "example.invalid/no:1" in condition(found, "Degraded")["message"]


def test_a_handler_that_does_not_load_is_degraded(cluster: Cluster) -> None:
    applied(cluster, model("e2e-load", model={"handler": "nosuch.module:Model"}))
    # What the model server writes as its termination message when the load fails.
    message = f"{LOAD_FAILED}ModuleNotFoundError: No module named 'nosuch'"
    crashed = {
        **waiting("CrashLoopBackOff", "back-off 40s restarting failed container"),
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
    }
    kubelet_reports(cluster, "e2e-load", {"containerStatuses": [crashed]})
    found = degraded(cluster, "e2e-load", "ModelLoadFailed")
    assert "No module named 'nosuch'" in condition(found, "Degraded")["message"]


def test_a_crash_loop_is_degraded(cluster: Cluster) -> None:
    applied(cluster, model("e2e-crash"))
    crashed = {
        **waiting("CrashLoopBackOff", "back-off 10s restarting failed container"),
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    }
    kubelet_reports(cluster, "e2e-crash", {"containerStatuses": [crashed]})
    found = degraded(cluster, "e2e-crash", "CrashLoopBackOff")
    assert "137" in condition(found, "Degraded")["message"]


def test_a_pod_no_node_takes_is_degraded(cluster: Cluster) -> None:
    applied(cluster, model("e2e-place", nodeSelector={"carpool.dev/pool": "nowhere"}))
    message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    kubelet_reports(cluster, "e2e-place", {"conditions": [{**scheduled, "message": message}]})
    found = degraded(cluster, "e2e-place", "Unschedulable")
    assert "didn't match" in condition(found, "Degraded")["message"]


def test_autoscaling_up_keeps_the_model_ready(cluster: Cluster) -> None:
    if cluster.api is None:
        pytest.skip("the test plays the Deployment controller and the HPA")
    scaled = model("e2e-hpa", autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    applied(cluster, scaled)
    deployment = cluster.wait_for_object("deployment", "e2e-hpa")

    def report(replicas: int, ready: int) -> None:
        status = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
        }
        cluster.kubectl(
            "patch", "deployment", "e2e-hpa", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    report(2, 2)
    ready = cluster.wait_for_object(
        "bm", "e2e-hpa", lambda found: condition(found, "Ready").get("status") == "True"
    )
    # The HPA scales to 5; three new pods start, not ready yet.
    cluster.kubectl(
        "patch", "deployment", "e2e-hpa", "--type=merge", "-p", '{"spec":{"replicas":5}}'
    )
    report(5, 2)
    cluster.wait_for_object(
        "bm", "e2e-hpa", lambda found: found["status"]["replicasReady"] == "2/5"
    )
    wait_resyncs(cluster)
    found = cluster.get("bm", "e2e-hpa")
    assert found is not None
    assert condition(found, "Ready")["status"] == "True"
    since = condition(ready, "Ready")["lastTransitionTime"]
    assert condition(found, "Ready")["lastTransitionTime"] == since
