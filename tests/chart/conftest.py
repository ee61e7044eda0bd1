"""The test API server the chart is installed into, with a kubeconfig in the release namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chart.rendering import NAMESPACE
from support.kube_api import ServedKubeApi
from support.kube_cluster import Cluster


@pytest.fixture
def served() -> Iterator[ServedKubeApi]:
    with ServedKubeApi() as served:
        yield served


@pytest.fixture
def cluster(served: ServedKubeApi, tmp_path: Path) -> Cluster:
    kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
    return Cluster(kubeconfig, NAMESPACE, served.api)
