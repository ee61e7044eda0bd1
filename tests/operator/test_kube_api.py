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
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


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


def test_a_selected_watch_hears_objects_enter_and_leave_the_selection(
    served: ServedKubeApi,
) -> None:
    """As the API server's watch cache: an object whose labels stop matching is DELETED (as
    it was, at the version that changed it), one whose labels start matching ADDED."""
    _, listing = call(served, "GET", CONFIGMAPS)
    version = listing["metadata"]["resourceVersion"]
    merge = "application/merge-patch+json"
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "moving", "labels": {"team": "a"}}})
    _, left = call(
        served, "PATCH", f"{CONFIGMAPS}/moving", {"metadata": {"labels": {"team": "b"}}}, merge
    )
    call(served, "PATCH", f"{CONFIGMAPS}/moving", {"data": {"unseen": "1"}}, merge)
    call(served, "PATCH", f"{CONFIGMAPS}/moving", {"metadata": {"labels": {"team": "a"}}}, merge)

    query = f"watch=true&resourceVersion={version}&timeoutSeconds=1&labelSelector=team%3Da"
    events = watch(served, f"{CONFIGMAPS}?{query}")
    assert [event["type"] for event in events] == ["ADDED", "DELETED", "ADDED"]
    gone = events[1]["object"]["metadata"]
    assert gone["labels"] == {"team": "a"}
    assert gone["resourceVersion"] == left["metadata"]["resourceVersion"]


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


def test_an_orphaning_delete_leaves_the_dependents_without_that_owner(
    served: ServedKubeApi,
) -> None:
    """`kubectl delete --cascade=orphan`: the garbage collector takes the owner's reference off
    its dependents, which stay; their other owners stay too."""
    reference, other = _owner(served, "orphaner"), _owner(served, "co-owner")
    body = {"metadata": {"name": "orphan", "ownerReferences": [reference, other]}}
    _, child = call(served, "POST", CONFIGMAPS, body)

    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}
    assert call(served, "DELETE", f"{CONFIGMAPS}/orphaner", options)[0] == 200
    assert call(served, "GET", f"{CONFIGMAPS}/orphaner")[0] == 404
    status, found = call(served, "GET", f"{CONFIGMAPS}/orphan")
    assert status == 200
    assert found["metadata"]["ownerReferences"] == [other]
    assert found["metadata"]["resourceVersion"] != child["metadata"]["resourceVersion"]
    # As a query parameter too; the last owner gone, no ownerReferences are left.
    call(served, "DELETE", f"{CONFIGMAPS}/co-owner?propagationPolicy=Orphan")
    _, found = call(served, "GET", f"{CONFIGMAPS}/orphan")
    assert "ownerReferences" not in found["metadata"]


def test_an_orphaning_delete_marks_the_owner_until_its_dependents_are_orphaned(
    served: ServedKubeApi,
) -> None:
    """The API server gives the owner a deletionTimestamp and the `orphan` finalizer; the
    garbage collector then takes its reference off each dependent and removes the finalizer,
    and only then is the owner gone: a watcher sees the three steps in that order."""
    reference = _owner(served, "marked")
    call(
        served,
        "POST",
        CONFIGMAPS,
        {"metadata": {"name": "marked-child", "ownerReferences": [reference]}},
    )
    _, listing = call(served, "GET", CONFIGMAPS)
    version = listing["metadata"]["resourceVersion"]

    options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}
    _, answer = call(served, "DELETE", f"{CONFIGMAPS}/marked", options)
    assert answer["metadata"]["deletionTimestamp"] and answer["metadata"]["finalizers"] == [
        "orphan"
    ]

    events = watch(served, f"{CONFIGMAPS}?watch=true&resourceVersion={version}&timeoutSeconds=1")
    steps = [(e["type"], e["object"]["metadata"]) for e in events]
    assert [(kind, metadata["name"]) for kind, metadata in steps] == [
        ("MODIFIED", "marked"),
        ("MODIFIED", "marked-child"),
        ("DELETED", "marked"),
    ]
    assert steps[0][1]["finalizers"] == ["orphan"] and steps[0][1]["deletionTimestamp"]
    assert "ownerReferences" not in steps[1][1]


@pytest.mark.parametrize("write", ["merge", "apply"])
def test_a_dependent_given_a_deleted_owners_reference_is_collected(
    served: ServedKubeApi, write: str
) -> None:
    """The garbage collector deletes a dependent none of whose owners exist, also one that
    gains its reference after the owner went (a controller racing the owner's deletion)."""
    reference = _owner(served, f"gone-{write}")
    call(served, "DELETE", f"{CONFIGMAPS}/gone-{write}")
    name = f"late-{write}"
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": name}})
    body: dict[str, Any] = {"metadata": {"ownerReferences": [reference]}}
    if write == "merge":
        status, _ = call(served, "PATCH", f"{CONFIGMAPS}/{name}", body, MERGE)
    else:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, **body["metadata"]},
        }
        status, _ = call(served, "PATCH", f"{CONFIGMAPS}/{name}?fieldManager=late", body, APPLY)
    assert status == 200
    assert call(served, "GET", f"{CONFIGMAPS}/{name}")[0] == 404


@pytest.mark.parametrize("write", ["merge", "apply"])
def test_a_patch_that_names_a_resource_version_is_refused_for_another(
    served: ServedKubeApi, write: str
) -> None:
    """A resourceVersion in a patch (an applied configuration too) is a precondition: a 409
    Conflict when the object has changed since, as for an update."""
    name = f"versioned-{write}"
    _, created = call(served, "POST", CONFIGMAPS, {"metadata": {"name": name}})
    _, changed = call(served, "PATCH", f"{CONFIGMAPS}/{name}", {"data": {"a": "1"}}, MERGE)

    def patch(version: str) -> tuple[int, Any]:
        metadata = {"name": name, "resourceVersion": version}
        if write == "merge":
            return call(
                served,
                "PATCH",
                f"{CONFIGMAPS}/{name}",
                {"metadata": metadata, "data": {"b": "2"}},
                MERGE,
            )
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"b": "2"}}
        return call(served, "PATCH", f"{CONFIGMAPS}/{name}?fieldManager=mine", body, APPLY)

    status, refused = patch(created["metadata"]["resourceVersion"])
    assert (status, refused["reason"]) == (409, "Conflict")
    assert "the object has been modified" in refused["message"]
    assert call(served, "GET", f"{CONFIGMAPS}/{name}")[1]["data"] == {"a": "1"}
    status, patched = patch(changed["metadata"]["resourceVersion"])
    assert status == 200 and patched["data"]["b"] == "2"


@pytest.mark.parametrize("field", ["uid", "resourceVersion"])
def test_a_delete_whose_preconditions_no_longer_hold_is_refused(
    served: ServedKubeApi, field: str
) -> None:
    """DeleteOptions' preconditions (uid, resourceVersion) are checked against the stored
    object: a 409 Conflict, the object kept, when one differs; deleted when they hold."""
    name = f"guarded-{field.lower()}"
    _, created = call(served, "POST", CONFIGMAPS, {"metadata": {"name": name}})
    _, changed = call(served, "PATCH", f"{CONFIGMAPS}/{name}", {"data": {"a": "1"}}, MERGE)
    stale = {"uid": "another", "resourceVersion": created["metadata"]["resourceVersion"]}

    def delete(wanted: dict[str, str]) -> tuple[int, Any]:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": wanted}
        return call(served, "DELETE", f"{CONFIGMAPS}/{name}", options)

    status, refused = delete({field: stale[field]})
    assert (status, refused["reason"]) == (409, "Conflict")
    assert "Precondition failed" in refused["message"]
    assert call(served, "GET", f"{CONFIGMAPS}/{name}")[0] == 200
    holding = {key: changed["metadata"][key] for key in ("uid", "resourceVersion")}
    assert delete(holding)[0] == 200
    assert call(served, "GET", f"{CONFIGMAPS}/{name}")[0] == 404


def _owner(served: ServedKubeApi, name: str) -> dict[str, str]:
    """A new ConfigMap `name`, as the owner reference its dependents would carry."""
    _, owner = call(served, "POST", CONFIGMAPS, {"metadata": {"name": name}})
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner["metadata"]["uid"]}


def test_writes_are_counted(served: ServedKubeApi) -> None:
    before = served.api.write_count()
    call(served, "GET", CONFIGMAPS)
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "counted"}})
    assert served.api.write_count() == before + 1


def test_writes_are_counted_by_what_they_are_about(served: ServedKubeApi) -> None:
    """A model's own writes, its children's and events about it; not its neighbour's."""
    events = "/api/v1/namespaces/default/events"
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "about"}})
    call(served, "PATCH", f"{CONFIGMAPS}/about", {"data": {"a": "1"}})
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "about-batching"}})
    call(served, "POST", CONFIGMAPS, {"metadata": {"name": "aboutness"}})
    regarding = {"kind": "ConfigMap", "name": "about", "namespace": "default"}
    event = {"metadata": {"generateName": "about."}, "involvedObject": regarding}
    call(served, "POST", events, {**event, "reason": "Told", "message": "m", "type": "Normal"})
    assert served.api.write_count(about="about") == 4
    assert served.api.write_count(about="aboutness") == 1


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


def _deployment(name: str, replicas: int | None) -> dict[str, Any]:
    """A Deployment to apply; None leaves replicas out."""
    labels = {"app": name}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "example.com/c:1"}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec}


def _replicas_only(name: str, replicas: int) -> dict[str, Any]:
    """The applied configuration of the docs' hand-over: spec.replicas and nothing else."""
    metadata = {"name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
            "spec": {"replicas": replicas}}  # fmt: skip


def _replicas_managers(deployment: dict[str, Any]) -> set[str]:
    """Who owns a Deployment's spec.replicas, as `manager` or `manager/subresource`."""
    owners = set()
    for entry in deployment["metadata"].get("managedFields", []):
        if "f:replicas" in entry["fieldsV1"].get("f:spec", {}):
            subresource = entry.get("subresource")
            owners.add(f"{entry['manager']}/{subresource}" if subresource else entry["manager"])
    return owners


def test_replicas_dropped_from_an_apply_fall_to_the_default(served: ServedKubeApi) -> None:
    """The server-side apply pitfall of the Kubernetes docs ("Transferring ownership"): a field
    its only manager stops applying is removed, and the API server defaults replicas to 1."""
    path = f"{DEPLOYMENTS}/dropped?fieldManager=carpool&force=true"
    # An apply that creates owns what it applied, not the defaults the object then got.
    _, created = call(served, "PATCH", path, _deployment("dropped", None), APPLY)
    assert created["spec"]["replicas"] == 1 and _replicas_managers(created) == set()
    _, applied = call(served, "PATCH", path, _deployment("dropped", 4), APPLY)
    assert applied["spec"]["replicas"] == 4
    _, applied = call(served, "PATCH", path, _deployment("dropped", None), APPLY)
    assert applied["spec"]["replicas"] == 1
    assert _replicas_managers(applied) == set()

    # The docs' procedure: a private manager first applies replicas alone, at the live value;
    # the field then survives the owner's apply without it.
    call(served, "PATCH", path, _deployment("dropped", 4), APPLY)
    handover = f"{DEPLOYMENTS}/dropped?fieldManager=handover"
    status, _ = call(served, "PATCH", handover, _replicas_only("dropped", 4), APPLY)
    assert status == 200
    _, applied = call(served, "PATCH", path, _deployment("dropped", None), APPLY)
    assert applied["spec"]["replicas"] == 4
    assert _replicas_managers(applied) == {"handover"}


def test_scale_subresource_takes_replicas_as_an_hpa_does(served: ServedKubeApi) -> None:
    """An HPA reads /scale and writes it back with the version it read; the writer then owns
    spec.replicas alone, in an entry marked `subresource: scale`, and a manager left owning
    nothing disappears."""
    call(served, "PATCH", f"{DEPLOYMENTS}/scaled?fieldManager=carpool",
         _deployment("scaled", 2), APPLY)  # fmt: skip
    handover = f"{DEPLOYMENTS}/scaled?fieldManager=handover"
    call(served, "PATCH", handover, _replicas_only("scaled", 2), APPLY)

    status, scale = call(served, "GET", f"{DEPLOYMENTS}/scaled/scale")
    assert status == 200 and scale["kind"] == "Scale"
    assert (scale["spec"]["replicas"], scale["status"]["selector"]) == (2, "app=scaled")
    scale["spec"]["replicas"] = 5
    hpa = f"{DEPLOYMENTS}/scaled/scale?fieldManager=kube-controller-manager"
    status, written = call(served, "PUT", hpa, scale)
    assert (status, written["spec"]["replicas"]) == (200, 5)
    _, found = call(served, "GET", f"{DEPLOYMENTS}/scaled")
    assert found["spec"]["replicas"] == 5
    assert _replicas_managers(found) == {"kube-controller-manager/scale"}
    managers = {entry["manager"] for entry in found["metadata"]["managedFields"]}
    assert managers == {"carpool", "kube-controller-manager"}  # "handover" owned nothing else

    # A stale Scale (the version read before this write) is refused, as the HPA's retry expects.
    status, _ = call(served, "PUT", hpa, scale)
    assert status == 409
    status, _ = call(served, "PATCH", hpa, {"spec": {"replicas": -1}}, MERGE)
    assert status == 422


def _deployment_with(name: str, container: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "x/y:1", **container}]},
            },
        },
    }


@pytest.mark.parametrize(
    ("container", "error"),
    [
        (
            {"env": [{"name": "LEVEL", "value": "a"}, {"name": "LEVEL", "value": "b"}]},
            '.spec.template.spec.containers[name="main"].env: duplicate entries for key '
            '[name="LEVEL"]',
        ),
        (
            {"volumeMounts": [{"name": v, "mountPath": "/tmp"} for v in ("a", "b")]},
            '.spec.template.spec.containers[name="main"].volumeMounts: duplicate entries for key '
            '[mountPath="/tmp"]',
        ),
        (
            {"env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPaht": "metadata.name"}}}]},
            '.spec.template.spec.containers[name="main"].env[name="POD"].valueFrom.fieldRef'
            ".fieldPaht: field not declared in schema",
        ),
    ],
    ids=["duplicate-env", "duplicate-mount", "undeclared-field"],
)
def test_an_apply_the_api_server_cannot_type_is_a_bare_500(
    served: ServedKubeApi, container: dict[str, Any], error: str
) -> None:
    """As structured-merge-diff types an applied configuration: the real texts, no reason."""
    body = _deployment_with("untyped", container)
    path = f"{DEPLOYMENTS}/untyped?fieldManager=test"
    status, answer = call(served, "PATCH", path, body, APPLY)
    prefix = "failed to create typed patch object (default/untyped; apps/v1, Kind=Deployment): "
    assert (status, answer["message"]) == (500, prefix + error)
    assert "reason" not in answer
    assert call(served, "GET", f"{DEPLOYMENTS}/untyped")[0] == 404


def test_every_error_of_an_untypable_apply_is_listed(served: ServedKubeApi) -> None:
    env = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    ports = [{"containerPort": 80, "protocol": "TCP"}] * 2
    body = _deployment_with("many", {"env": env, "ports": ports})
    status, answer = call(served, "PATCH", f"{DEPLOYMENTS}/many?fieldManager=test", body, APPLY)
    where = '.spec.template.spec.containers[name="main"]'
    assert status == 500
    assert answer["message"].endswith(
        "Kind=Deployment): errors:\n"
        f'  {where}.env: duplicate entries for key [name="A"]\n'
        f'  {where}.ports: duplicate entries for key [containerPort=80,protocol="TCP"]'
    )


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("0.0001", "100u"),
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("0.0000000001", "1n"),
        ("1.5Gi", "1536Mi"),
        ("1024Ki", "1Mi"),
        ("0.5Ki", "512"),
        # Parsed on the fast path and already canonical to the parser: kept as written.
        ("0500m", "0500m"),
    ],
)
def test_quantities_are_stored_as_the_api_server_writes_them(
    served: ServedKubeApi, written: str, stored: str
) -> None:
    name = f"quantity-{len(served.api.records)}"
    body = _deployment_with(name, {"resources": {"requests": {"cpu": written, "memory": written}}})
    _, created = call(served, "POST", DEPLOYMENTS, body)
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": stored, "memory": stored}


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
