"""The test API server keeps the promises kopf, kubectl and helm rely on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.kube_api import ServedKubeApi
from support.kube_cluster import Cluster
from support.kube_http import call, watch
from support.kube_rbac import binding

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture(scope="module")
def served() -> Iterator[ServedKubeApi]:
    with ServedKubeApi() as server:
        yield server


def test_objects_get_identity_and_lists_get_a_version(served: ServedKubeApi) -> None:
    status, created = call(served, "POST", CONFIGMAPS, {"metadata": {"name": "ident"}})
    assert status == 201
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
    assert created["metadata"]["creationTimestamp"]
    _, listing = call(served, "GET", CONFIGMAPS)
    assert listing["kind"] == "ConfigMapList"
    assert int(listing["metadata"]["resourceVersion"]) >= int(
        created["metadata"]["resourceVersion"]
    )
    status, conflict = call(served, "POST", CONFIGMAPS, {"metadata": {"name": "ident"}})
    assert (status, conflict["reason"]) == (409, "AlreadyExists")


def test_watch_resumes_after_the_listed_version(served: ServedKubeApi) -> None:
    _, listing = call(served, "GET", CONFIGMAPS)
    version = listing["metadata"]["resourceVersion"]
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "after-list"}})
    call(
        served,
        "PATCH",
        f"{CONFIGMAPS}/after-list",
        {"data": {"a": "1"}},
        "application/merge-patch+json",
    )

    events = watch(served, f"{CONFIGMAPS}?watch=true&resourceVersion={version}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after-list"),
        ("MODIFIED", "after-list"),
    ]


def test_no_op_writes_keep_the_version(served: ServedKubeApi) -> None:
    _, created = call(
        served, "POST", CONFIGMAPS, {"metadata": {"name": "noop"}, "data": {"k": "v"}}
    )
    _, patched = call(
        served, "PATCH", f"{CONFIGMAPS}/noop", {"data": {"k": "v"}}, "application/merge-patch+json"
    )
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_status_subresource_is_split(served: ServedKubeApi) -> None:
    body = {"metadata": {"name": "split"}, "spec": {"replicas": 1}, "status": {"readyReplicas": 9}}
    _, created = call(served, "POST", DEPLOYMENTS, body)
    assert "status" not in created  # ignored on create
    merge = "application/merge-patch+json"
    _, patched = call(
        served, "PATCH", f"{DEPLOYMENTS}/split", {"status": {"readyReplicas": 1}}, merge
    )
    assert "status" not in patched
    assert patched["metadata"]["generation"] == 1
    _, patched = call(
        served,
        "PATCH",
        f"{DEPLOYMENTS}/split/status",
        {"status": {"readyReplicas": 1}, "spec": {"replicas": 7}},
        merge,
    )
    assert patched["status"] == {"readyReplicas": 1}
    assert patched["spec"]["replicas"] == 1
    _, patched = call(served, "PATCH", f"{DEPLOYMENTS}/split", {"spec": {"replicas": 2}}, merge)
    assert patched["metadata"]["generation"] == 2


def test_json_patch_test_operation_guards_finalizers(served: ServedKubeApi) -> None:
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "fin", "finalizers": ["x/y"]}})
    failing = [{"op": "test", "path": "/metadata/finalizers", "value": []}]
    status, _ = call(served, "PATCH", f"{CONFIGMAPS}/fin", failing, "application/json-patch+json")
    assert status == 422

    status, deleting = call(served, "DELETE", f"{CONFIGMAPS}/fin")
    assert status == 200 and deleting["metadata"]["deletionTimestamp"]
    release = [
        {"op": "test", "path": "/metadata/finalizers", "value": ["x/y"]},
        {"op": "remove", "path": "/metadata/finalizers"},
    ]
    status, _ = call(served, "PATCH", f"{CONFIGMAPS}/fin", release, "application/json-patch+json")
    assert status == 200
    assert call(served, "GET", f"{CONFIGMAPS}/fin")[0] == 404


def test_owner_references_are_garbage_collected(served: ServedKubeApi) -> None:
    reference = _owner(served, "owner")
    _, child = call(
        served, "POST", CONFIGMAPS, {"metadata": {"name": "child", "ownerReferences": [reference]}}
    )
    grandchild_ref = {**reference, "name": "child", "uid": child["metadata"]["uid"]}
    call(
        served,
        "POST",
        CONFIGMAPS,
        {"metadata": {"name": "grandchild", "ownerReferences": [grandchild_ref]}},
    )

    call(served, "DELETE", f"{CONFIGMAPS}/owner")
    for name in ("child", "grandchild"):
        assert call(served, "GET", f"{CONFIGMAPS}/{name}")[0] == 404


def test_a_child_whose_owner_is_already_gone_is_collected(served: ServedKubeApi) -> None:
    # A controller applying a child just after its owner was deleted: the garbage collector
    # deletes a dependent none of whose owners exist, whenever it was created.
    reference = _owner(served, "late-owner")
    call(served, "DELETE", f"{CONFIGMAPS}/late-owner")
    body = {"metadata": {"name": "late-child", "ownerReferences": [reference]}}
    assert call(served, "POST", CONFIGMAPS, body)[0] == 201
    assert call(served, "GET", f"{CONFIGMAPS}/late-child")[0] == 404
    body = {
        "metadata": {"name": "kept", "ownerReferences": [reference, _owner(served, "live-owner")]}
    }
    call(served, "POST", CONFIGMAPS, body)
    assert call(served, "GET", f"{CONFIGMAPS}/kept")[0] == 200


def _owner(served: ServedKubeApi, name: str) -> dict[str, str]:
    """A new ConfigMap `name`, as the owner reference its dependents would carry."""
    _, owner = call(served, "POST", CONFIGMAPS, {"metadata": {"name": name}})
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner["metadata"]["uid"]}


def test_writes_are_counted(served: ServedKubeApi) -> None:
    before = served.api.write_count()
    call(served, "GET", CONFIGMAPS)
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "counted"}})
    assert served.api.write_count() == before + 1


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (all lengths here stay below 128)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_protobuf_secrets_as_helm_writes_them(served: ServedKubeApi) -> None:
    labels = _field(11, _field(1, b"owner") + _field(2, b"helm"))
    metadata = _field(1, b"sh.helm.release.v1.x.v1") + _field(3, b"") + labels
    secret = _field(1, metadata) + _field(2, _field(1, b"release") + _field(2, b"\x00\x01"))
    envelope = b"k8s\x00" + _field(1, _field(1, b"v1") + _field(2, b"Secret")) + _field(2, secret)
    request = urllib.request.Request(
        served.url + "/api/v1/namespaces/default/secrets", data=envelope, method="POST"
    )
    request.add_header("Content-Type", "application/vnd.kubernetes.protobuf")
    with urllib.request.urlopen(request, timeout=10) as response:
        created = json.loads(response.read())
    assert created["metadata"]["labels"] == {"owner": "helm"}
    assert created["metadata"]["namespace"] == "default"
    assert created["data"] == {"release": "AAE="}


def test_server_side_apply_tracks_field_ownership(
    served: ServedKubeApi, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """kubectl's server-side apply: removal of dropped fields, conflicts, force, shared lists."""
    kubeconfig = served.write_kubeconfig(tmp_path_factory.mktemp("ssa") / "kubeconfig")
    cluster = Cluster(kubeconfig, "default", served.api)

    def apply(manager: str, data: dict[str, str], *flags: str) -> Any:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "owned"},
            "data": data,
        }
        return cluster.kubectl(
            "apply", "--server-side", f"--field-manager={manager}", *flags, "-f", "-",
            stdin=json.dumps(body), check=False,
        )  # fmt: skip

    assert apply("alice", {"a": "1", "b": "2"}).returncode == 0
    assert apply("alice", {"a": "1"}).returncode == 0  # b dropped: alice's alone, so removed
    found = cluster.get("configmap", "owned")
    assert found is not None and found["data"] == {"a": "1"}

    refused = apply("bob", {"a": "9"})
    assert refused.returncode != 0 and 'conflict with "alice"' in refused.stderr
    assert apply("bob", {"a": "9"}, "--force-conflicts").returncode == 0
    # alice no longer owns a: her next apply without it leaves bob's value.
    assert apply("alice", {"c": "3"}).returncode == 0
    found = cluster.get("configmap", "owned")
    assert found is not None and found["data"] == {"a": "9", "c": "3"}
    shown = cluster.kubectl("get", "configmap", "owned", "-o", "json", "--show-managed-fields")
    managed = json.loads(shown.stdout)["metadata"]["managedFields"]
    managers = {entry["manager"] for entry in managed}
    assert managers == {"alice", "bob"}


def test_a_watch_from_a_compacted_version_is_told_to_list_again() -> None:
    with ServedKubeApi() as fresh:
        _, listing = call(fresh, "GET", CONFIGMAPS)
        before = listing["metadata"]["resourceVersion"]
        call(fresh, "POST", CONFIGMAPS, {"metadata": {"name": "missed"}})
        fresh.api.compact()
        (event,) = watch(fresh, f"{CONFIGMAPS}?watch=true&resourceVersion={before}")
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
        assert f"too old resource version: {before}" in event["object"]["message"]

        _, listing = call(fresh, "GET", CONFIGMAPS)
        assert [item["metadata"]["name"] for item in listing["items"]] == ["missed"]
        since = listing["metadata"]["resourceVersion"]
        call(fresh, "DELETE", f"{CONFIGMAPS}/missed")
        events = watch(fresh, f"{CONFIGMAPS}?watch=true&resourceVersion={since}&timeoutSeconds=1")
        assert [event["type"] for event in events] == ["DELETED"]


RBAC = "/apis/rbac.authorization.k8s.io/v1"


def test_rbac_grants_a_service_account_what_its_bindings_say() -> None:
    with ServedKubeApi() as fresh:
        token = fresh.api.service_account_token("ops", "robot")
        status, denied = call(fresh, "GET", CONFIGMAPS, token=token)
        assert (status, denied["reason"]) == (403, "Forbidden")
        assert denied["message"] == (
            'configmaps is forbidden: User "system:serviceaccount:ops:robot" cannot list '
            'resource "configmaps" in API group "" in the namespace "default"'
        )
        assert call(fresh, "GET", "/apis", token=token)[0] == 200  # discovery is open

        role = {
            "metadata": {"name": "reader"},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]},
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "verbs": ["get"],
                    "resourceNames": ["named"],
                },
            ],
        }
        call(fresh, "POST", f"{RBAC}/namespaces/default/roles", role)
        bound = binding("Role", "reader", "ops", "robot")
        call(fresh, "POST", f"{RBAC}/namespaces/default/rolebindings", bound)
        secrets = "/api/v1/namespaces/default/secrets"
        answers = {
            "list here": call(fresh, "GET", CONFIGMAPS, token=token)[0],
            "list elsewhere": call(fresh, "GET", "/api/v1/namespaces/ops/configmaps", token=token)[
                0
            ],
            "watch": call(fresh, "GET", f"{CONFIGMAPS}?watch=true", token=token)[0],
            "named secret": call(fresh, "GET", f"{secrets}/named", token=token)[0],
            "other secret": call(fresh, "GET", f"{secrets}/other", token=token)[0],
            "all secrets": call(fresh, "GET", secrets, token=token)[0],
        }
        assert answers == {
            "list here": 200,
            "list elsewhere": 403,
            "watch": 403,
            "named secret": 404,  # allowed, and not there
            "other secret": 403,
            "all secrets": 403,
        }


def test_an_apply_that_creates_needs_create_too() -> None:
    with ServedKubeApi() as fresh:
        token = fresh.api.service_account_token("ops", "robot")
        role = {
            "metadata": {"name": "patcher"},
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}],
        }
        call(fresh, "POST", f"{RBAC}/clusterroles", role)
        bound = binding("ClusterRole", "patcher", "ops", "robot")
        call(fresh, "POST", f"{RBAC}/clusterrolebindings", bound)
        path = f"{DEPLOYMENTS}/applied?fieldManager=robot"
        manifest = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "applied"}}
        apply = "application/apply-patch+yaml"
        status, denied = call(fresh, "PATCH", path, manifest, apply, token=token)
        assert (status, denied["reason"]) == (403, "Forbidden")
        assert "cannot create resource" in denied["message"]

        role["rules"][0]["verbs"] = ["patch", "create"]
        call(fresh, "PUT", f"{RBAC}/clusterroles/patcher", role)
        assert call(fresh, "PATCH", path, manifest, apply, token=token)[0] == 201
