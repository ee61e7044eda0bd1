"""Fixtures for the operator's end-to-end tests: one API server and one operator per module.

`cluster` runs every scenario twice: against the test API server (always) and against a real
cluster (marked e2e_cluster; only when CARPOOL_E2E_KUBECONFIG names a kubeconfig).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, Cluster, free_port, run_operator


@pytest.fixture(scope="module")
def operator_metrics_port() -> int:
    """The local port of the module's operator's /metrics."""
    return free_port()


@pytest.fixture(
    scope="module",
    params=["emulator", pytest.param("real", marks=pytest.mark.e2e_cluster)],
)
def cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    operator_metrics_port: int,
) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("kube")
    if request.param == "emulator":
        with ServedKubeApi() as served:
            kubeconfig = served.write_kubeconfig(folder / "kubeconfig")
            test_cluster = Cluster(kubeconfig, "default", served.api, operator_metrics_port)
            test_cluster.kubectl("apply", "-f", str(CRD))
            log = folder / "operator.log"
            with run_operator(kubeconfig, "default", log, metrics_port=operator_metrics_port):
                yield test_cluster
        return
    configured = os.environ.get("CARPOOL_E2E_KUBECONFIG")
    if not configured:
        pytest.skip("set CARPOOL_E2E_KUBECONFIG to run against a real cluster")
    namespace = f"carpool-e2e-{uuid.uuid4().hex[:6]}"
    test_cluster = Cluster(Path(configured), namespace, None, operator_metrics_port)
    test_cluster.kubectl("apply", "-f", str(CRD))
    test_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/batchedmodels.carpool.dev", "--timeout=60s"
    )
    test_cluster.kubectl("create", "namespace", namespace)
    try:
        log = folder / "operator.log"
        with run_operator(Path(configured), namespace, log, metrics_port=operator_metrics_port):
            yield test_cluster
    finally:
        test_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
