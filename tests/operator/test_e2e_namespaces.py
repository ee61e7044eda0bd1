"""End to end: an operator given kopf's namespace patterns serves the namespaces kopf serves.

`--namespace` takes kopf's patterns as well as names: globs, `!` to exclude, several globs
in one pattern separated by commas (an exclusion first implies `*` before it). kopf runs the
handlers of the BatchedModels in the namespaces the patterns match; the operator's cache
must hold the same ones, or those handlers read nothing and the models are never served.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, Cluster, free_port, run_operator
from support.kube_models import applied, model, wait_resyncs


@pytest.mark.parametrize("pattern", ["team-*,!team-x", "!team-x"])
def test_a_namespace_pattern_serves_what_kopf_serves(tmp_path: Path, pattern: str) -> None:
    with ServedKubeApi() as served:
        kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig")
        served_team = Cluster(kubeconfig, "team-a", served.api, free_port())
        left_out = Cluster(kubeconfig, "team-x", served.api, served_team.operator_metrics_port)
        served_team.kubectl("apply", "-f", str(CRD))
        for namespace in ("team-a", "team-x"):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            served_team.apply(body)
        log = tmp_path / "operator.log"
        port = served_team.operator_metrics_port
        with run_operator(kubeconfig, pattern, log, metrics_port=port):
            left_out.apply(model("excluded"))
            applied(served_team, model("included"))
            served_team.wait_for_object("deployment", "included")
            wait_resyncs(served_team)
            assert left_out.get("deployment", "excluded") is None
            assert not left_out.get("bm", "excluded").get("status")
