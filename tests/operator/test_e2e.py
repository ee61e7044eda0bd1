"""End to end: the real operator and the real kubectl against an API server.

Every test runs on the test API server; with CARPOOL_E2E_KUBECONFIG set, also on a real cluster
(`-m e2e_cluster`). On the test API server no controller runs, so where a scenario needs a
Deployment's status the test writes it, as the Deployment controller would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube_api import Kind
from support.kube_cluster import OPERATOR_AGENT, Cluster
from support.kube_models import applied, condition, degraded, model, wait_resyncs
from support.operator_metrics import Sample, scrape

from carpool_operator.defaults import DEFAULT_SIDECAR_IMAGE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INVALID = Path(__file__).resolve().parent / "invalid"
LABELS = {
    "app.kubernetes.io/name": "batchedmodel",
    "app.kubernetes.io/component": "model",
    "app.kubernetes.io/managed-by": "carpool",
}


def owned_by(child: dict[str, Any], owner: dict[str, Any]) -> bool:
    refs = child["metadata"].get("ownerReferences", [])
    return any(ref["uid"] == owner["metadata"]["uid"] and ref.get("controller") for ref in refs)


def fake_rollout(cluster: Cluster, name: str, ready: int) -> None:
    """What the Deployment controller and kubelet would report once `ready` pods serve."""
    if cluster.api is None:
        pytest.skip("a real cluster reports readiness itself; the default image may not exist")
    deployment = cluster.wait_for_object("deployment", name)
    replicas = deployment["spec"]["replicas"]
    status = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    cluster.kubectl(
        "patch", "deployment", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def test_apply_creates_owned_children(cluster: Cluster) -> None:
    owner = applied(cluster, model("e2e-create", batching={"maxBatchSize": 8}))

    deployment = cluster.wait_for_object("deployment", "e2e-create")
    service = cluster.wait_for_object("service", "e2e-create")
    config = cluster.wait_for_object("configmap", "e2e-create-batching")
    for child in (deployment, service, config):
        assert owned_by(child, owner)
        assert LABELS.items() <= child["metadata"]["labels"].items()

    pod = deployment["spec"]["template"]["spec"]
    containers = {container["name"]: container for container in pod["containers"]}
    assert containers["model-server"]["command"][:4] == [
        "carpool",
        "model-server",
        "--handler",
        "toy",
    ]
    assert "--socket" in containers["model-server"]["command"]
    assert containers["model-server"]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sidecar = containers["sidecar"]
    assert sidecar["command"][-2:] == ["--config-file", "/etc/carpool/batching.json"]
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == "/etc/carpool")
    assert "subPath" not in mount
    for container in containers.values():
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
        assert security["capabilities"]["drop"] == ["ALL"]
        assert not security["allowPrivilegeEscalation"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"

    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http", "grpc"]
    settings = json.loads(config["data"]["batching.json"])
    assert settings["maxBatchSize"] == 8
    # The status shows what the sidecars run with: the spec over the operator's defaults.
    reported = cluster.wait_for_object(
        "bm", "e2e-create", lambda found: "batching" in found["status"]
    )
    assert reported["status"]["batching"] == settings
    assert settings["maxWaitMs"] == 5  # the built-in default: this operator sets none
    assert cluster.get("pdb", "e2e-create") is None  # one replica: no budget


def test_status_mirrors_the_deployment(cluster: Cluster) -> None:
    applied(cluster, model("e2e-status", replicas=2, batching={"maxBatchSize": 16, "maxWaitMs": 7}))
    waiting = cluster.wait_for_object("bm", "e2e-status")
    assert condition(waiting, "Ready")["status"] == "False"
    assert condition(waiting, "Ready")["reason"] == "ReplicasNotReady"
    assert waiting["status"]["replicasReady"] == "0/2"
    first_transition = condition(waiting, "Ready")["lastTransitionTime"]

    fake_rollout(cluster, "e2e-status", ready=2)
    ready = cluster.wait_for_object(
        "bm", "e2e-status", lambda found: condition(found, "Ready").get("status") == "True"
    )
    assert ready["status"]["replicasReady"] == "2/2"
    assert condition(ready, "Progressing")["status"] == "False"
    assert condition(ready, "Degraded")["status"] == "False"
    assert condition(ready, "Ready")["lastTransitionTime"] >= first_transition

    table = cluster.kubectl("get", "bm", "e2e-status").stdout.split("\n")
    assert table[0].split() == ["NAME", "READY", "REPLICAS", "MAXBATCH", "MAXWAIT", "URL", "AGE"]
    row = table[1].split()
    assert row[:5] == ["e2e-status", "True", "2/2", "16", "7"]
    assert row[5] == f"http://e2e-status.{cluster.namespace}.svc.cluster.local"

    events = cluster.kubectl(
        "get", "events", "--field-selector", "involvedObject.name=e2e-status", "-o", "json"
    )
    reasons = {event["reason"] for event in json.loads(events.stdout)["items"]}
    assert {"ChildCreated", "ReplicasReady"} <= reasons

    # A resync must not touch lastTransitionTime while nothing flips.
    wait_resyncs(cluster)
    again = cluster.get("bm", "e2e-status")
    assert again is not None
    assert condition(again, "Ready") == condition(ready, "Ready")


def test_batching_edit_changes_config_not_pods(cluster: Cluster) -> None:
    applied(cluster, model("e2e-batching"))
    before = cluster.wait_for_object("deployment", "e2e-batching")

    cluster.kubectl(
        "patch", "bm", "e2e-batching", "--type=merge",
        "-p", json.dumps({"spec": {"batching": {"maxBatchSize": 64, "dispatch": "fixed"}}}),
    )  # fmt: skip

    def reconfigured(found: dict[str, Any]) -> bool:
        settings = json.loads(found["data"]["batching.json"])
        return bool(settings["maxBatchSize"] == 64 and settings["dispatch"] == "fixed")

    cluster.wait_for_object("configmap", "e2e-batching-batching", reconfigured)
    wait_resyncs(cluster)
    after = cluster.get("deployment", "e2e-batching")
    assert after is not None
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def events(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    found = cluster.kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json"
    )
    return [item for item in json.loads(found.stdout)["items"] if item["reason"] == reason]


def model_server_flag(deployment: dict[str, Any], flag: str) -> str:
    (server,) = [
        container
        for container in deployment["spec"]["template"]["spec"]["containers"]
        if container["name"] == "model-server"
    ]
    command: list[str] = server["command"]
    return command[command.index(flag) + 1]


def test_batch_size_is_clamped_to_the_model_limit(cluster: Cluster) -> None:
    applied(cluster, model("e2e-clamp", batching={"maxBatchSize": 128}))
    deployment = cluster.wait_for_object("deployment", "e2e-clamp")
    assert model_server_flag(deployment, "--max-batch-size") == "64"  # the CRD's default

    # The status shows the batch size in effect; a Warning event says why, once.
    clamped = cluster.wait_for_object(
        "bm", "e2e-clamp", lambda found: "batching" in found.get("status", {})
    )
    assert clamped["status"]["batching"]["maxBatchSize"] == 64
    config = cluster.wait_for_object("configmap", "e2e-clamp-batching")
    assert json.loads(config["data"]["batching.json"])["maxBatchSize"] == 64
    cluster.wait_for(
        "the clamp warning", lambda: bool(events(cluster, "e2e-clamp", "BatchSizeClamped"))
    )
    wait_resyncs(cluster, count=3)
    (warning,) = events(cluster, "e2e-clamp", "BatchSizeClamped")
    assert warning["type"] == "Warning"
    assert "128" in warning["message"] and "64" in warning["message"]

    # Raising the model's limit rolls the pods and lifts the clamp, without a new warning.
    cluster.kubectl(
        "patch", "bm", "e2e-clamp", "--type=merge",
        "-p", json.dumps({"spec": {"model": {"maxBatchSize": 256}}}),
    )  # fmt: skip
    rolled = cluster.wait_for_object(
        "deployment",
        "e2e-clamp",
        lambda found: model_server_flag(found, "--max-batch-size") == "256",
    )
    assert rolled["metadata"]["generation"] > deployment["metadata"]["generation"]
    cluster.wait_for_object(
        "bm", "e2e-clamp", lambda found: found["status"]["batching"]["maxBatchSize"] == 128
    )
    wait_resyncs(cluster)
    assert len(events(cluster, "e2e-clamp", "BatchSizeClamped")) == 1

    # Asking for more than the new limit warns again, once.
    cluster.kubectl(
        "patch", "bm", "e2e-clamp", "--type=merge",
        "-p", json.dumps({"spec": {"batching": {"maxBatchSize": 512}}}),
    )  # fmt: skip
    cluster.wait_for(
        "a second clamp warning",
        lambda: len(events(cluster, "e2e-clamp", "BatchSizeClamped")) == 2,
    )
    reported = cluster.get("bm", "e2e-clamp")
    assert reported is not None and reported["status"]["batching"]["maxBatchSize"] == 256
    wait_resyncs(cluster, count=3)
    assert len(events(cluster, "e2e-clamp", "BatchSizeClamped")) == 2


def test_image_edit_rolls_the_pods(cluster: Cluster) -> None:
    applied(cluster, model("e2e-image"))
    before = cluster.wait_for_object("deployment", "e2e-image")
    image = "registry.example.com/team/carpool:0.2.0"

    cluster.kubectl(
        "patch", "bm", "e2e-image", "--type=merge",
        "-p", json.dumps({"spec": {"model": {"image": image}}}),
    )  # fmt: skip

    def rolled(found: dict[str, Any]) -> bool:
        images = {c["name"]: c["image"] for c in found["spec"]["template"]["spec"]["containers"]}
        # The sidecar keeps its own image: only the model's changed.
        return images == {"model-server": image, "sidecar": DEFAULT_SIDECAR_IMAGE}

    after = cluster.wait_for_object("deployment", "e2e-image", rolled)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]


@pytest.mark.parametrize("code", [500, 503])
def test_transient_api_errors_are_retried(cluster: Cluster, code: int) -> None:
    if cluster.api is None:
        pytest.skip("a real API server cannot be told to fail")
    name = f"e2e-flaky-{code}"
    path = f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/{name}"
    cluster.api.fail("PATCH", path, code=code, times=3)
    cluster.apply(model(name))
    cluster.wait_for_object("deployment", name)
    assert cluster.api.request_count("PATCH", path, agent=OPERATOR_AGENT) >= 4


def test_deleted_deployment_is_restored(cluster: Cluster) -> None:
    applied(cluster, model("e2e-restore"))
    first = cluster.wait_for_object("deployment", "e2e-restore")

    cluster.kubectl("delete", "deployment", "e2e-restore", "--wait=false")
    restored = cluster.wait_for_object(
        "deployment",
        "e2e-restore",
        lambda found: found["metadata"]["uid"] != first["metadata"]["uid"],
    )
    assert restored["spec"]["template"]["spec"]["containers"][0]["name"] == "model-server"


def test_hand_edited_children_are_restored(cluster: Cluster) -> None:
    applied(cluster, model("e2e-drift"))
    cluster.wait_for_object("service", "e2e-drift")
    original = cluster.wait_for_object("deployment", "e2e-drift")

    ports = [{"name": "http", "port": 9999, "targetPort": "http", "protocol": "TCP"}]
    cluster.kubectl(
        "patch",
        "service",
        "e2e-drift",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"ports": ports}}),
    )
    # Port 80 is carpool's again; the port the merge patch added is its author's to remove
    # (Service ports merge by port and protocol under server-side apply).
    cluster.wait_for_object(
        "service",
        "e2e-drift",
        lambda found: 80 in [port["port"] for port in found["spec"]["ports"]],
    )

    # A strategic merge patch, as `kubectl set image` or a hurried human would send.
    path = f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/e2e-drift"
    patches = cluster.api.request_count("PATCH", path) if cluster.api is not None else 0
    edit = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "x/y:1"}]}}}}
    cluster.kubectl("patch", "deployment", "e2e-drift", "-p", json.dumps(edit))
    restored = cluster.wait_for_object(
        "deployment",
        "e2e-drift",
        lambda found: found["spec"]["template"] == original["spec"]["template"],
    )
    assert restored["metadata"]["uid"] == original["metadata"]["uid"]
    if cluster.api is not None:  # kubectl's patch and one repair
        assert cluster.api.request_count("PATCH", path) == patches + 2


def test_deleting_the_model_collects_children(cluster: Cluster) -> None:
    applied(cluster, model("e2e-delete", replicas=2))
    cluster.wait_for_object("pdb", "e2e-delete")

    cluster.kubectl("delete", "bm", "e2e-delete")
    for kind, name in (
        ("deployment", "e2e-delete"),
        ("service", "e2e-delete"),
        ("configmap", "e2e-delete-batching"),
        ("pdb", "e2e-delete"),
    ):
        cluster.wait_gone(kind, name)


def test_a_model_applied_again_after_an_orphaning_delete_adopts_its_children(
    cluster: Cluster,
) -> None:
    first = applied(cluster, model("e2e-orphans", replicas=2))
    children = [("deployment", "e2e-orphans"), ("service", "e2e-orphans")]
    children += [("configmap", "e2e-orphans-batching"), ("pdb", "e2e-orphans")]
    before = {kind: cluster.wait_for_object(kind, name) for kind, name in children}

    # kubectl waits until the model is gone, which is after the garbage collector took its
    # reference off every child (and a reconcile under way puts none back).
    cluster.kubectl("delete", "bm", "e2e-orphans", "--cascade=orphan")
    cluster.wait_gone("bm", "e2e-orphans")
    for kind, name in children:
        orphan = cluster.get(kind, name)
        assert orphan is not None and not orphan["metadata"].get("ownerReferences"), kind

    # The same model again, with a change the Deployment must take.
    image = "registry.example.com/team/carpool:0.3.0"
    again = applied(
        cluster, model("e2e-orphans", replicas=2, model={"handler": "toy", "image": image})
    )
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    # Not Degraded only once a reconcile applied every child (one may wait for the watches to
    # tell of the orphaning first).
    settled = cluster.wait_for_object(
        "bm",
        "e2e-orphans",
        lambda found: condition(found, "Degraded").get("reason") == "AsExpected",
    )
    assert condition(settled, "Degraded")["status"] == "False"
    for kind, name in children:
        child = cluster.get(kind, name)
        assert child is not None and owned_by(child, again), kind
        # Adopted, not made anew.
        assert child["metadata"]["uid"] == before[kind]["metadata"]["uid"], kind
        if kind == "deployment":
            assert child["spec"]["template"]["spec"]["containers"][0]["image"] == image
    adopted = [event["message"] for event in events(cluster, "e2e-orphans", "ChildAdopted")]
    assert "adopted Deployment e2e-orphans, which an earlier e2e-orphans left" in adopted


def test_a_model_made_again_at_once_waits_for_its_predecessors_children_to_go(
    cluster: Cluster,
) -> None:
    """Deleted and applied again before the garbage collector, which works in the background,
    removed the children: they are the deleted model's, on their way out, not someone else's.
    The new model waits for them to go and makes its own, never Degraded meanwhile."""
    first = applied(cluster, model("e2e-again"))
    cluster.wait_for_object("deployment", "e2e-again", lambda found: owned_by(found, first))
    if cluster.api is not None:
        cluster.api.gc_delay_s = 2.0
    try:
        cluster.kubectl("delete", "bm", "e2e-again")
        cluster.apply(model("e2e-again", replicas=2))
        again = cluster.wait_for_object("bm", "e2e-again")
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
        cluster.wait_for_object(
            "deployment",
            "e2e-again",
            lambda found: owned_by(found, again) and found["spec"]["replicas"] == 2,
        )
    finally:
        if cluster.api is not None:
            cluster.api.gc_delay_s = 0.0
    settled = cluster.wait_for_object("bm", "e2e-again", lambda found: condition(found, "Ready"))
    assert condition(settled, "Degraded")["reason"] == "AsExpected"
    assert events(cluster, "e2e-again", "NameConflict") == []


def _config_map(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"mine": "yes"},
    }


@pytest.mark.parametrize("case", ["unlabelled", "another-model", "made-by-hand"])
def test_a_child_name_taken_by_someone_else_is_a_name_conflict(cluster: Cluster, case: str) -> None:
    """Only what carpool made for this model and nobody controls now is adopted."""
    name = f"e2e-taken-{case}"
    labels = {**LABELS, "app.kubernetes.io/name": "batchedmodel"}
    taken = {
        "unlabelled": _config_map(f"{name}-batching", {}),
        "another-model": _config_map(
            f"{name}-batching", {**labels, "app.kubernetes.io/instance": "someone-else"}
        ),
        # carpool's labels, written by kubectl: not carpool's field manager.
        "made-by-hand": _config_map(
            f"{name}-batching", {**labels, "app.kubernetes.io/instance": name}
        ),
    }[case]
    cluster.apply(taken)
    cluster.apply(model(name))
    found = degraded(cluster, name, "NameConflict")
    assert f"ConfigMap {name}-batching" in condition(found, "Degraded")["message"]
    kept = cluster.get("configmap", f"{name}-batching")
    assert kept is not None and kept["data"] == {"mine": "yes"}
    assert not kept["metadata"].get("ownerReferences")


def test_schema_rejects_invalid_specs(cluster: Cluster) -> None:
    result = cluster.kubectl("apply", "-f", str(INVALID / "min-over-max.yaml"), check=False)
    assert result.returncode != 0
    assert "minReplicas must not exceed maxReplicas" in result.stderr

    result = cluster.kubectl("apply", "-f", str(INVALID / "out-of-bounds.yaml"), check=False)
    assert result.returncode != 0
    assert "spec.replicas" in result.stderr and "fp64" in result.stderr
    assert cluster.get("bm", "broken") is None


def test_unrealisable_spec_is_degraded_without_retry_storm(cluster: Cluster) -> None:
    applied(cluster, model("e2e-degraded", model={"handler": "no handler here"}))
    degraded = cluster.wait_for_object(
        "bm", "e2e-degraded", lambda found: condition(found, "Degraded").get("status") == "True"
    )
    assert condition(degraded, "Degraded")["reason"] == "InvalidHandler"
    assert cluster.get("deployment", "e2e-degraded") is None

    version = degraded["metadata"]["resourceVersion"]
    wait_resyncs(cluster, count=3)
    still = cluster.get("bm", "e2e-degraded")
    assert still is not None and still["metadata"]["resourceVersion"] == version

    # Fixing the spec brings the model up.
    cluster.kubectl(
        "patch", "bm", "e2e-degraded", "--type=merge",
        "-p", json.dumps({"spec": {"model": {"handler": "toy"}}}),
    )  # fmt: skip
    cluster.wait_for_object("deployment", "e2e-degraded")
    cluster.wait_for_object(
        "bm", "e2e-degraded", lambda found: condition(found, "Degraded").get("status") == "False"
    )


def test_resync_of_unchanged_model_writes_nothing(cluster: Cluster) -> None:
    applied(cluster, model("e2e-quiet", replicas=2))
    children = [("deployment", "e2e-quiet"), ("service", "e2e-quiet"), ("pdb", "e2e-quiet")]
    children += [("configmap", "e2e-quiet-batching"), ("bm", "e2e-quiet")]
    for kind, name in children:
        cluster.wait_for_object(kind, name)
    wait_resyncs(cluster, count=1)  # settle: the status is written once

    def versions() -> dict[str, str]:
        found = {kind: cluster.get(kind, name) for kind, name in children}
        return {kind: body["metadata"]["resourceVersion"] for kind, body in found.items() if body}

    before = versions()
    writes = cluster.api.write_count() if cluster.api is not None else 0
    wait_resyncs(cluster, count=3)
    assert versions() == before
    if cluster.api is not None:
        # Counted at the API server: no request at all that could write, from anyone.
        assert cluster.api.write_count() == writes


def test_resync_of_a_model_with_quantities_the_api_server_rewrites_writes_nothing(
    cluster: Cluster,
) -> None:
    """Quantities stored in another form than written: a tenth of a millicore is "100u"."""
    resources = {"cpu": "0.0001", "memory": "1.5Gi"}
    sidecar = {"resources": {"cpu": "0500m", "memory": "0.25Gi"}}
    applied(cluster, model("e2e-tiny", resources=resources, sidecar=sidecar))
    deployment = cluster.wait_for_object("deployment", "e2e-tiny")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["model-server"]["resources"]["requests"]["cpu"] == "100u"
    wait_resyncs(cluster, count=1)  # settle: the status is written once

    writes = cluster.api.write_count() if cluster.api is not None else 0
    version = deployment["metadata"]["resourceVersion"]
    wait_resyncs(cluster, count=3)
    after = cluster.get("deployment", "e2e-tiny")
    assert after is not None and after["metadata"]["resourceVersion"] == version
    assert len(events(cluster, "e2e-tiny", "ChildUpdated")) == 0
    if cluster.api is not None:
        assert cluster.api.write_count() == writes


def test_autoscaled_model_leaves_replicas_to_the_hpa(cluster: Cluster) -> None:
    example = yaml.safe_load((EXAMPLES / "autoscaled.yaml").read_text())
    example["metadata"] = {"name": "e2e-scaled"}
    applied(cluster, example)
    hpa = cluster.wait_for_object("hpa", "e2e-scaled")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "carpool_queue_items"
    cluster.wait_for_object("pdb", "e2e-scaled")

    # Where the HPA scaled to, the operator leaves it.
    scaled = json.dumps({"spec": {"replicas": 5}})
    cluster.kubectl("patch", "deployment", "e2e-scaled", "--type=merge", "-p", scaled)
    wait_resyncs(cluster)
    deployment = cluster.get("deployment", "e2e-scaled")
    assert deployment is not None and deployment["spec"]["replicas"] == 5

    cluster.kubectl(
        "patch", "bm", "e2e-scaled", "--type=merge",
        "-p", json.dumps({"spec": {"autoscaling": {"enabled": False}, "replicas": 1}}),
    )  # fmt: skip
    cluster.wait_gone("hpa", "e2e-scaled")
    cluster.wait_gone("pdb", "e2e-scaled")
    cluster.wait_for_object(
        "deployment", "e2e-scaled", lambda found: found["spec"]["replicas"] == 1
    )


def test_podmonitor_only_where_the_api_exists(cluster: Cluster) -> None:
    if cluster.api is None:
        pytest.skip("whether a real cluster serves monitoring.coreos.com is not ours to change")
    applied(cluster, model("e2e-monitored", monitoring={"podMonitor": True}))
    wait_resyncs(cluster)
    assert not cluster.kubectl("api-resources", check=False).stdout.count("podmonitors")

    cluster.api.serve_kind(Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"))
    monitor = cluster.wait_for_object("podmonitors.monitoring.coreos.com", "e2e-monitored")
    ports = [endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]]
    assert ports == ["http", "metrics"]


def models_seen(port: int) -> float:
    found = scrape(port)
    return sum(found[("carpool_operator_models", (("ready", r),))] for r in ("true", "false"))


def models_in(cluster: Cluster) -> int:
    listed = json.loads(cluster.kubectl("get", "bm", "-o", "json").stdout)
    return len(listed["items"])


def test_operator_metrics_count_its_work(cluster: Cluster, operator_metrics_port: int) -> None:
    port = operator_metrics_port
    applied(cluster, model("e2e-metrics"))
    cluster.wait_for_object("deployment", "e2e-metrics")

    def counted(found: dict[Sample, float]) -> bool:
        # A counter moves just after the request it counts: wait, rather than race it.
        wanted = [("carpool_operator_reconciles_total", (("result", "success"),))]
        wanted += [("carpool_operator_reconcile_duration_seconds_count", ())]
        kinds = ("ConfigMap", "Deployment", "Service", "BatchedModel")
        wanted += [("carpool_operator_writes_total", (("kind", kind),)) for kind in kinds]
        return all(found.get(sample, 0) > 0 for sample in wanted)

    cluster.wait_for("reconciles and writes counted", lambda: counted(scrape(port)))

    applied(cluster, model("e2e-metrics-bad", model={"handler": "no handler here"}))
    degraded = ("carpool_operator_reconciles_total", (("result", "degraded"),))
    cluster.wait_for("a degraded reconcile counted", lambda: scrape(port)[degraded] > 0)
    cluster.kubectl("delete", "bm", "e2e-metrics-bad")

    # The gauge follows the BatchedModels there are, and forgets a deleted one.
    cluster.wait_for("every model counted", lambda: models_seen(port) == models_in(cluster))
    cluster.kubectl("delete", "bm", "e2e-metrics")
    cluster.wait_for("the deleted model forgotten", lambda: models_seen(port) == models_in(cluster))
