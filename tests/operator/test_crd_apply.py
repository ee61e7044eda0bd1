"""The CRD as a user installs it: the real kubectl against an API server that validates CRDs.

Issue #24: a real API server refused `kubectl apply -f crds/` (and so `helm install`), because
the root CEL rules named `.metadata.name` as their fieldPath while the schema declared no
`metadata.name` for the path to resolve against.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD, Cluster
from support.kube_models import model

NAME = "batchedmodels.carpool.dev"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ServedKubeApi() as served:
        yield Cluster(served.write_kubeconfig(tmp_path / "kubeconfig"), "default", served.api)


def test_kubectl_applies_the_crd_folder(cluster: Cluster) -> None:
    result = cluster.kubectl("apply", "-f", str(CRD.parent), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"customresourcedefinition.apiextensions.k8s.io/{NAME} created"
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{NAME}", "--timeout=10s")
    cluster.apply(model("toy"))
    assert cluster.get("bm", "toy") is not None


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("1model", "the name must be a DNS-1035 label"),
        ("my.model", "the name must be a DNS-1035 label"),
        ("m" * 53, "the name must be at most 52 characters"),
    ],
)
def test_a_bad_name_is_refused_naming_the_field(cluster: Cluster, name: str, words: str) -> None:
    cluster.kubectl("apply", "-f", str(CRD))
    result = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(model(name)), check=False)
    assert result.returncode != 0
    assert f'The BatchedModel "{name}" is invalid: metadata.name: Invalid value' in result.stderr
    assert words in result.stderr
    assert cluster.get("bm", name) is None


def test_a_root_rule_pointing_into_undeclared_metadata_is_refused(cluster: Cluster) -> None:
    """The mistake of issue #24, put back into today's CRD, as kubectl reports it."""
    crd = yaml.safe_load(CRD.read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["metadata"] = {"type": "object"}
    rules = [rule for rule in root["x-kubernetes-validations"] if "fieldPath" in rule]
    assert rules, "the root rules no longer name the field they check"
    result = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(crd), check=False)
    assert result.returncode != 0
    assert f'The CustomResourceDefinition "{NAME}" is invalid:' in result.stderr
    for number, rule in enumerate(root["x-kubernetes-validations"]):
        if "fieldPath" in rule:
            where = f"spec.validation.openAPIV3Schema.x-kubernetes-validations[{number}].fieldPath"
            assert f'{where}: Invalid value: "{rule["fieldPath"]}": must be a valid path' in (
                result.stderr
            )
    assert cluster.get("crd", NAME) is None
