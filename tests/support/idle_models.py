"""Many BatchedModels left alone, and what the operator asks the API server about them.

Shared by the idle test (tests/operator/test_e2e_idle.py) and its big brother
(bench/operator_idle.py).
"""

from __future__ import annotations

import json

from support.kube_api import KubeApiServer
from support.kube_cluster import OPERATOR_AGENT, Cluster
from support.kube_models import condition, model

OPERATOR_AGENTS = (OPERATOR_AGENT, "kopf")  # the operator's own client and kopf's


def create_models(cluster: Cluster, names: list[str]) -> None:
    """One small CPU model per name, in one kubectl apply."""
    stream = "\n---\n".join(json.dumps(model(name)) for name in names)
    cluster.kubectl("apply", "-f", "-", stdin=stream)


def reported(cluster: Cluster) -> int:
    """How many BatchedModels have a status (a Ready condition, either way)."""
    listed = json.loads(cluster.kubectl("get", "bm", "-o", "json").stdout)["items"]
    return sum(1 for item in listed if condition(item, "Ready"))


def operator_requests(api: KubeApiServer, start: int) -> list[str]:
    """The operator's requests (kopf's included) from the `start`-th logged request on."""
    return [
        f"{record.method} {record.path}"
        for record in list(api.records)[start:]
        if record.agent.startswith(OPERATOR_AGENTS)
    ]
