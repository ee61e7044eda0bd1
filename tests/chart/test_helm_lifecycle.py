"""`helm install`, `upgrade` and `uninstall` of the chart against the test API server."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.rendering import CHART, NAMESPACE, RELEASE, run_helm
from support.kube_cluster import Cluster

CRD_NAME = "batchedmodels.carpool.dev"


def operator_env(cluster: Cluster) -> dict[str, str]:
    deployment = cluster.get("deployment", "carpool")
    assert deployment is not None, "the operator Deployment is missing"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container["env"]}


def notes_example(notes: str) -> dict[str, Any]:
    """The BatchedModel that NOTES.txt tells the user to apply, from its heredoc."""
    match = re.search(r"<<EOF\n(.*?)\n\s*EOF", notes, re.DOTALL)
    assert match, f"NOTES.txt has no example manifest:\n{notes}"
    lines = match.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    example: dict[str, Any] = yaml.safe_load("\n".join(line[indent:] for line in lines))
    return example


def test_install_upgrade_uninstall_keeps_the_crd(cluster: Cluster) -> None:
    notes = run_helm(cluster, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace")
    assert "STATUS: deployed" in notes
    for kind, name in [
        ("deployment", "carpool"),
        ("serviceaccount", "carpool"),
        ("configmap", "carpool-dashboard"),
        ("clusterrole", "carpool"),
        ("clusterrolebinding", "carpool"),
        ("customresourcedefinition", CRD_NAME),
    ]:
        assert cluster.get(kind, name) is not None, f"{kind}/{name} not installed"
    assert operator_env(cluster)["CARPOOL_DEFAULT_MAX_BATCH_SIZE"] == "32"

    # The next step NOTES.txt gives works: the CRD is served and accepts the example.
    cluster.apply(notes_example(notes))
    assert cluster.get("batchedmodel", "toy") is not None

    run_helm(
        cluster, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE,
        "--set", "defaults.maxBatchSize=64", "--set", "dashboard.enabled=false",
    )  # fmt: skip
    assert operator_env(cluster)["CARPOOL_DEFAULT_MAX_BATCH_SIZE"] == "64"
    assert cluster.get("configmap", "carpool-dashboard") is None
    history = json.loads(run_helm(cluster, "history", RELEASE, "-n", NAMESPACE, "-o", "json"))
    assert [entry["status"] for entry in history] == ["superseded", "deployed"]

    output = run_helm(cluster, "uninstall", RELEASE, "-n", NAMESPACE)
    assert CRD_NAME in output  # helm lists what the resource policy kept
    for kind, name in [
        ("deployment", "carpool"),
        ("serviceaccount", "carpool"),
        ("clusterrole", "carpool"),
        ("clusterrolebinding", "carpool"),
    ]:
        assert cluster.get(kind, name) is None, f"{kind}/{name} left after uninstall"
    crd = cluster.get("customresourcedefinition", CRD_NAME)
    assert crd is not None, "crds.keep=true, yet the CRD went with the release"
    assert cluster.get("batchedmodel", "toy") is not None, "the user's BatchedModel is gone"
    assert run_helm(cluster, "list", "-n", NAMESPACE, "-q").strip() == ""


def test_uninstall_removes_the_crd_unless_kept(cluster: Cluster) -> None:
    run_helm(
        cluster, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--set", "crds.keep=false",
    )  # fmt: skip
    assert cluster.get("customresourcedefinition", CRD_NAME) is not None
    run_helm(cluster, "uninstall", RELEASE, "-n", NAMESPACE)
    assert cluster.get("customresourcedefinition", CRD_NAME) is None


def test_upgrade_upgrades_the_crd(cluster: Cluster, tmp_path: Path) -> None:
    """The CRD is a template, not in crds/, so a chart upgrade reaches it: here a new chart
    version whose CRD has one more short name."""
    run_helm(cluster, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace")
    before = cluster.get("customresourcedefinition", CRD_NAME)
    assert before is not None
    assert "bmodel" not in before["spec"]["names"]["shortNames"]

    newer = tmp_path / "carpool"
    shutil.copytree(CHART, newer)
    crd_file = newer / "files" / "crds" / f"{CRD_NAME}.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["names"]["shortNames"].append("bmodel")
    crd_file.write_text(yaml.safe_dump(crd))
    chart = yaml.safe_load((newer / "Chart.yaml").read_text())
    chart["version"] = "0.1.1"
    (newer / "Chart.yaml").write_text(yaml.safe_dump(chart))

    run_helm(cluster, "upgrade", RELEASE, str(newer), "-n", NAMESPACE)
    after = cluster.get("customresourcedefinition", CRD_NAME)
    assert after is not None
    assert "bmodel" in after["spec"]["names"]["shortNames"]
    assert after["metadata"]["labels"]["helm.sh/chart"] == "carpool-0.1.1"


@pytest.mark.parametrize(
    ("installed", "upgraded", "kept"),
    [
        (("crds.keep=true",), ("crds.install=false",), True),
        (("crds.keep=false",), ("crds.install=false", "crds.keep=false"), False),
        # The policy read is the live CRD's, as the previous release left it.
        (("crds.keep=false",), ("crds.install=false", "crds.keep=true"), False),
    ],
    ids=["kept", "deleted", "keep-too-late"],
)
def test_switching_crd_install_off_deletes_an_unkept_crd(
    cluster: Cluster, installed: tuple[str, ...], upgraded: tuple[str, ...], kept: bool
) -> None:
    """What docs/install.md warns of: the upgrade that stops rendering the CRD deletes it
    (and with it every BatchedModel) unless the CRD in the cluster says keep."""

    def sets(values: tuple[str, ...]) -> list[str]:
        return [arg for value in values for arg in ("--set", value)]

    install = ["install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace"]
    run_helm(cluster, *install, *sets(installed))
    run_helm(cluster, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *sets(upgraded))
    assert (cluster.get("customresourcedefinition", CRD_NAME) is not None) is kept
