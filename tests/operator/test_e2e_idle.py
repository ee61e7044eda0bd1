"""End to end: models at rest cost the API server next to nothing.

Idle, the operator's reads come from its watches' cache: a resync of unchanged models sends no
request per model, counted at the test API server, kopf's requests included.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, OPERATOR_AGENT, Cluster, free_port, run_operator
from support.kube_models import condition, model, wait_resyncs
from support.operator_metrics import resyncs

MODELS = 40
PASSES = 4
OPERATOR_AGENTS = (OPERATOR_AGENT, "kopf")


def test_idle_resyncs_cost_at_most_one_request_per_model(tmp_path: Path) -> None:
    with ServedKubeApi() as served:
        cluster = Cluster(served.write_kubeconfig(tmp_path / "kubeconfig"), "default", served.api)
        cluster.operator_metrics_port = port = free_port()
        cluster.kubectl("apply", "-f", str(CRD))
        names = [f"idle-{index}" for index in range(MODELS)]
        stream = "\n---\n".join(json.dumps(model(name)) for name in names)
        cluster.kubectl("apply", "-f", "-", stdin=stream)

        def reported() -> bool:
            listed = json.loads(cluster.kubectl("get", "bm", "-o", "json").stdout)["items"]
            return sum(1 for item in listed if condition(item, "Ready")) == MODELS

        log = tmp_path / "operator.log"
        with run_operator(
            cluster.kubeconfig, "default", log, resync_seconds=0.5, metrics_port=port
        ):
            cluster.wait_for("a status on every model", reported, timeout=60)
            wait_resyncs(cluster, count=1)  # settle: every status written
            start, passes = len(served.api.records), resyncs(port)
            wait_resyncs(cluster, count=PASSES)
            passes = resyncs(port) - passes
            asked = [
                f"{record.method} {record.path}"
                for record in served.api.records[start:]
                if record.agent.startswith(OPERATOR_AGENTS)
            ]
    per_model = len(asked) / (MODELS * passes)
    assert per_model <= 1, f"{per_model:.2f} requests per model per resync: {asked[:20]}"
