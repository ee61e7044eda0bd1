"""End to end: a BatchedModel's deletion needs no operator.

The operator adds no finalizer, so deleting a BatchedModel while no operator runs (after
`helm uninstall`, say) finishes, and garbage collection takes its children.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, Cluster, run_operator
from support.kube_models import applied, model


@pytest.fixture(params=["emulator", pytest.param("real", marks=pytest.mark.e2e_cluster)])
def idle_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster with the CRD and no operator running."""
    if request.param == "emulator":
        with ServedKubeApi() as served:
            cluster = Cluster(
                served.write_kubeconfig(tmp_path / "kubeconfig"), "default", served.api
            )
            cluster.kubectl("apply", "-f", str(CRD))
            yield cluster
        return
    configured = os.environ.get("CARPOOL_E2E_KUBECONFIG")
    if not configured:
        pytest.skip("set CARPOOL_E2E_KUBECONFIG to run against a real cluster")
    cluster = Cluster(Path(configured), f"carpool-e2e-{uuid.uuid4().hex[:6]}")
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("create", "namespace", cluster.namespace)
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "namespace", cluster.namespace, "--wait=false", check=False)


def test_delete_finishes_without_an_operator(idle_cluster: Cluster, tmp_path: Path) -> None:
    cluster = idle_cluster
    with run_operator(cluster.kubeconfig, cluster.namespace, tmp_path / "operator.log"):
        body = applied(cluster, model("e2e-orphan"))
        cluster.wait_for_object("deployment", "e2e-orphan")
        cluster.wait_for_object("configmap", "e2e-orphan-batching")
        assert not body["metadata"].get("finalizers")

    result = cluster.kubectl("delete", "bm", "e2e-orphan", "--timeout=30s", check=False)
    assert result.returncode == 0, result.stderr
    cluster.wait_gone("bm", "e2e-orphan")
    cluster.wait_gone("deployment", "e2e-orphan")
    cluster.wait_gone("configmap", "e2e-orphan-batching")
