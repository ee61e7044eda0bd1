"""The chart's ClusterRole allows exactly what the real operator does, no more, no less.

The operator runs with the args and env of the chart's Deployment (cluster-wide, as installed
by default, and on named namespaces with operator.watchNamespaces) against the test API
server, which logs every request; a BatchedModel goes through a whole life: created with every
optional child, its children tampered with (and repaired), changed so the optional children
go, deleted. Each logged request is mapped to the RBAC (group, resource, verb) it needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.chart_operator import run_chart_operator
from chart.rendering import CHART, NAMESPACE, RELEASE, REPO, helm, one, render
from support.kube_api import Kind, ServedKubeApi, parse_target
from support.kube_cluster import CRD, Cluster
from support.kube_models import condition, degraded, model

MODELS = "models"
ELSEWHERE = "elsewhere"  # not named by operator.watchNamespaces
# Requests of these clients are the test's own, not the operator's.
TEST_AGENTS = ("Helm/", "kubectl")
COMPONENT = "app.kubernetes.io/component"
Permission = tuple[str, str, str]  # API group, resource (with subresource), verb
# Checked by admission (OwnerReferencesPermissionEnforcement) when a child's ownerReference
# sets blockOwnerDeletion, never by a request of its own.
ADMISSION_ONLY: set[Permission] = {("carpool.dev", "batchedmodels/finalizers", "update")}


# The optional children's API groups: their rules are needed only where a model uses them.
OPTIONAL_GROUPS = {"policy", "autoscaling", "monitoring.coreos.com"}


@pytest.fixture
def cluster(served: ServedKubeApi, tmp_path: Path) -> Cluster:
    served.api.serve_kind(Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"))
    kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig", namespace=MODELS)
    return Cluster(kubeconfig, MODELS, served.api)


def permissions(role: dict[str, Any]) -> set[Permission]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def granted_by_chart(sets: tuple[str, ...] = ()) -> set[Permission]:
    """The ClusterRole's rules and those of every Role (each in a watched namespace)."""
    manifests = render(sets=sets)
    granted = permissions(one(manifests, "ClusterRole"))
    roles = [doc for doc in manifests if doc["kind"] == "Role"]
    for role in roles:
        granted |= permissions(role)
    # Named namespaces: the application rules are in a Role there, and nowhere cluster-wide.
    assert [role["metadata"]["namespace"] for role in roles] == ([MODELS] if sets else [])
    bindings = [doc["metadata"]["namespace"] for doc in manifests if doc["kind"] == "RoleBinding"]
    assert bindings == ([MODELS] if sets else [])
    if sets:
        cluster_wide = {resource for _, resource, _ in permissions(one(manifests, "ClusterRole"))}
        assert cluster_wide == {"customresourcedefinitions", "namespaces"}
    return granted


def used_by_operator(cluster: Cluster) -> set[Permission]:
    assert cluster.api is not None
    used: set[Permission] = set()
    for record in cluster.api.records:
        if record.agent.startswith(TEST_AGENTS):
            continue
        target = parse_target(record.path)
        if target is None or not target.plural:
            continue  # discovery (/api, /apis/<group>/<version>) is open to every user
        resource = f"{target.plural}/{target.subresource}" if target.subresource else target.plural
        verbs = {"POST": ["create"], "PATCH": ["patch"], "PUT": ["update"], "DELETE": ["delete"]}
        if record.method == "GET":
            watching = "watch=true" in record.query.split("&")
            needed = ["get"] if target.name else ["watch"] if watching else ["list"]
        elif record.content_type.startswith("application/apply-patch"):
            # A server-side apply that creates its object is authorized as create too.
            needed = ["patch", "create"]
        else:
            needed = verbs[record.method]
        used |= {(target.group, resource, verb) for verb in needed}
    return used


@pytest.mark.parametrize(
    "sets", [(), (f"operator.watchNamespaces={{{MODELS}}}",)], ids=["cluster-wide", "namespaced"]
)
def test_cluster_role_is_exactly_what_the_operator_uses(
    cluster: Cluster, tmp_path: Path, sets: tuple[str, ...]
) -> None:
    set_args = [arg for item in sets for arg in ("--set", item)]
    # An operator on named namespaces serves them once they exist.
    for namespace in (MODELS, ELSEWHERE):
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    elsewhere = Cluster(cluster.kubeconfig, ELSEWHERE, cluster.api)
    helm(
        "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--kubeconfig", str(cluster.kubeconfig), *set_args,
    )  # fmt: skip
    with run_chart_operator(render(sets=sets), cluster, tmp_path / "operator.log"):
        model = yaml.safe_load((REPO / "examples" / "autoscaled.yaml").read_text())
        stranger = {**model, "metadata": {"name": "stranger", "namespace": ELSEWHERE}}
        elsewhere.apply(stranger)
        model["metadata"]["namespace"] = MODELS
        model["spec"]["monitoring"] = {"podMonitor": True}
        # A Secret the model's env reads: the kubelet reads it, the operator never does.
        cluster.kubectl("create", "secret", "generic", "token", "--from-literal=token=x")
        reference = {"secretKeyRef": {"name": "token", "key": "token"}}
        model["spec"]["model"]["env"] = [{"name": "TOKEN", "valueFrom": reference}]
        cluster.apply(model)
        children = {kind: "toy" for kind in ("deployment", "service", "hpa", "pdb", "podmonitor")}
        children["configmap"] = "toy-batching"
        for kind, name in children.items():
            cluster.wait_for_object(kind, name)
        if sets:  # an operator on named namespaces leaves the others alone
            assert elsewhere.get("deployment", "stranger") is None
        else:
            elsewhere.wait_for_object("deployment", "stranger")

        # Drift: a child's label changed behind the operator's back is patched back.
        for kind, name in children.items():
            cluster.kubectl("label", "--overwrite", kind, name, f"{COMPONENT}=tampered")
        for kind, name in children.items():
            cluster.wait_for_object(kind, name, _repaired)

        # One replica, no HPA (so no PDB either), no PodMonitor: the optional children go.
        smaller = {
            "autoscaling": {"enabled": False},
            "replicas": 1,
            "monitoring": {"podMonitor": False},
        }
        cluster.kubectl(
            "patch", "batchedmodel", "toy", "--type=merge", "-p", json.dumps({"spec": smaller})
        )
        for kind in ("hpa", "pdb", "podmonitor"):
            cluster.wait_gone(kind, "toy")
        cluster.kubectl("delete", "batchedmodel", "toy", "--wait=false")
        cluster.wait_gone("batchedmodel", "toy")
        if sets:
            assert elsewhere.get("deployment", "stranger") is None

    used = used_by_operator(cluster)
    granted = granted_by_chart(sets) - ADMISSION_ONLY
    assert used - granted == set(), f"the operator needs rules the chart lacks: {used - granted}"
    assert granted - used == set(), f"the chart grants rules nobody used: {granted - used}"


def _repaired(child: dict[str, Any]) -> bool:
    return bool(child["metadata"]["labels"][COMPONENT] == "model")


def test_rules_for_optional_kinds_no_model_uses_may_be_left_out(
    served: ServedKubeApi, cluster: Cluster, tmp_path: Path
) -> None:
    """An admin writes the RBAC (`rbac.create=false`) without PDBs, HPAs and PodMonitors.

    The operator runs as the chart's ServiceAccount, authorized by that RBAC alone: a model
    that needs none of the three runs and gets its status; one that needs a PDB is Degraded
    with reason Forbidden, the API server's message naming the resource and the verb, until
    the admin grants the rule.
    """
    manifests = render(sets=("rbac.create=false",))
    assert not [doc for doc in manifests if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    written = render()
    role, binding = one(written, "ClusterRole"), one(written, "ClusterRoleBinding")
    full = role["rules"]
    role["rules"] = [rule for rule in full if not OPTIONAL_GROUPS & set(rule["apiGroups"])]
    cluster.kubectl("apply", "-f", str(CRD))
    for document in (role, binding):
        cluster.apply(document)
    (account,) = binding["subjects"]
    token = served.api.service_account_token(account["namespace"], account["name"])
    kubeconfig = served.write_kubeconfig(tmp_path / "operator", namespace=MODELS, token=token)
    operator = Cluster(kubeconfig, MODELS, served.api)

    with run_chart_operator(manifests, operator, tmp_path / "operator.log"):
        cluster.apply(model("plain"))
        cluster.apply(model("spread", replicas=2))  # two replicas: a PodDisruptionBudget
        found = degraded(cluster, "spread", "Forbidden")
        message = condition(found, "Degraded")["message"]
        assert 'cannot list resource "poddisruptionbudgets" in API group "policy"' in message
        cluster.wait_for_object(
            "bm", "plain", lambda found: condition(found, "Degraded").get("status") == "False"
        )
        assert cluster.get("deployment", "plain") is not None

        role["rules"] = full
        cluster.apply(role)
        cluster.wait_for_object("pdb", "spread")
        cluster.wait_for_object(
            "bm", "spread", lambda found: condition(found, "Degraded").get("status") == "False"
        )
