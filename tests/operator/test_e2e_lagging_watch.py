"""End to end: a watch that lags behind the writes costs no extra write and undoes nothing.

An API server's watch cache may tell of a write a moment after answering it. The operator
keeps what each write answered and never lets an older event replace it, so a reconcile in
that moment neither applies a child nor writes a status that is already there, and a late
event of an older spec never rolls a child back.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from support.fault_api import FaultyServedKubeApi
from support.kube_cluster import CRD, OPERATOR_AGENT, Cluster, free_port, run_operator
from support.kube_http import watch
from support.kube_models import applied, model, wait_resyncs

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
MODELS = "/apis/carpool.dev/v1alpha1/namespaces/default/batchedmodels"


def versions(served: FaultyServedKubeApi, collection: str, name: str) -> list[dict[str, Any]]:
    """Every version of one object the server stored, oldest first."""
    query = f"watch=true&resourceVersion=1&timeoutSeconds=1&fieldSelector=metadata.name={name}"
    return [event["object"] for event in watch(served, f"{collection}?{query}")]


def test_a_lagging_watch_costs_no_extra_write(tmp_path: Path) -> None:
    with FaultyServedKubeApi() as served:
        served.api.watch_lag_s = 1.0
        kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig")
        cluster = Cluster(kubeconfig, "default", served.api, free_port())
        cluster.kubectl("apply", "-f", str(CRD))
        port, log = cluster.operator_metrics_port, tmp_path / "operator.log"
        with run_operator(kubeconfig, "default", log, resync_seconds=0.3, metrics_port=port):
            applied(cluster, model("lagged"))
            wait_resyncs(cluster, count=6)  # well past the lag
            # Two changes within the lag: each write's event comes after the next write.
            for replicas in (3, 4):
                patch = json.dumps({"spec": {"replicas": replicas}})
                cluster.kubectl("patch", "bm", "lagged", "--type=merge", "-p", patch)
            cluster.wait_for_object(
                "deployment", "lagged", lambda found: found["spec"]["replicas"] == 4
            )
            wait_resyncs(cluster, count=6)
        deployments = versions(served, DEPLOYMENTS, "lagged")
        models = versions(served, MODELS, "lagged")
        applies = served.api.request_count("PATCH", f"{DEPLOYMENTS}/lagged", agent=OPERATOR_AGENT)
        status_path = f"{MODELS}/lagged/status"
        status_writes = served.api.request_count("PATCH", status_path, agent=OPERATOR_AGENT)

    # Every apply changed the Deployment, and its replicas only ever went up (1, [3,] 4).
    assert applies == len(deployments)
    replicas = [deployment["spec"]["replicas"] for deployment in deployments]
    assert replicas == sorted(replicas) and replicas[-1] == 4, replicas
    # Every status write changed the status, which never went back to an older generation.
    statuses = [found.get("status") for found in models]
    changes = sum(1 for before, after in itertools.pairwise(statuses) if before != after)
    assert status_writes == changes, (status_writes, statuses)
    observed = [status["observedGeneration"] for status in statuses if status]
    assert observed == sorted(observed), observed
