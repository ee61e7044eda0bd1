"""End to end: models at rest cost the API server next to nothing.

Idle, the operator's reads come from its watches' cache: a resync of unchanged models sends no
request per model, counted at the test API server, kopf's requests included.
bench/operator_idle.py measures the same at 1,000 models over 10 minutes.
"""

from __future__ import annotations

from pathlib import Path

from support.idle_models import create_models, operator_requests, reported
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, Cluster, free_port, run_operator
from support.kube_models import wait_resyncs
from support.operator_metrics import resyncs

MODELS = 40
PASSES = 4


def test_idle_resyncs_cost_at_most_one_request_per_model(tmp_path: Path) -> None:
    with ServedKubeApi() as served:
        cluster = Cluster(served.write_kubeconfig(tmp_path / "kubeconfig"), "default", served.api)
        cluster.operator_metrics_port = port = free_port()
        cluster.kubectl("apply", "-f", str(CRD))
        create_models(cluster, [f"idle-{index}" for index in range(MODELS)])
        log = tmp_path / "operator.log"
        with run_operator(
            cluster.kubeconfig, "default", log, resync_seconds=0.5, metrics_port=port
        ):
            cluster.wait_for("a status on every model", lambda: reported(cluster) == MODELS, 60)
            wait_resyncs(cluster, count=1)  # settle: every status written
            start, passes = len(served.api.records), resyncs(port)
            wait_resyncs(cluster, count=PASSES)
            passes = resyncs(port) - passes
            asked = operator_requests(served.api, start)
    per_model = len(asked) / (MODELS * passes)
    assert per_model <= 1, f"{per_model:.2f} requests per model per resync: {asked[:20]}"
