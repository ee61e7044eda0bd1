"""`carpool render` checks the CRD's free-form parts against Kubernetes' own schemas.

The CRD keeps some core/v1 types free-form (x-kubernetes-preserve-unknown-fields): the API
server stores anything there, and a mistake surfaced only when the Deployment was refused.
`carpool render` checks them against Kubernetes' strict schemas for the oldest Kubernetes the
chart supports, naming the BatchedModel's field; without kubernetes-validate it says what it
did not check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from carpool_operator.free_form import FREE_FORM, KUBERNETES_VERSION
from carpool_operator.render import render

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "batchedmodels.carpool.dev.yaml").read_text())
(VERSION,) = [version for version in CRD["spec"]["versions"] if version["storage"]]
CHART = yaml.safe_load((ROOT / "charts" / "carpool" / "Chart.yaml").read_text())
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "m"}},
                },
            }
        ]
    },
}
ENV = [
    {"name": "LEVEL", "value": "info"},
    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]


def model(name: str, env: list[Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {"model": {"handler": "toy", **({"env": env} if env else {})}, **spec},
    }


def carpool_render(path: Path, *python: str) -> subprocess.CompletedProcess[str]:
    """`carpool render -f path`; `python` runs first in the process (to hide a package)."""
    start = ";".join([*python, "from carpool.cli import main", "main()"])
    return subprocess.run(
        [sys.executable, "-c", start, "render", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def free_form_nodes(schema: dict[str, Any], path: str) -> Iterator[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        yield path
    for key, sub in schema.get("properties", {}).items():
        yield from free_form_nodes(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("items"), dict):
        yield from free_form_nodes(schema["items"], f"{path}[]")


def test_every_free_form_part_of_the_crd_is_checked() -> None:
    assert set(FREE_FORM) == set(free_form_nodes(VERSION["schema"]["openAPIV3Schema"], ""))


def test_the_kubernetes_version_is_the_oldest_the_chart_supports() -> None:
    oldest = re.fullmatch(r">=(\d+\.\d+)\.0-0", CHART["kubeVersion"])
    assert oldest is not None, CHART["kubeVersion"]
    assert oldest.group(1) == KUBERNETES_VERSION


@pytest.mark.parametrize(
    "body",
    [*(yaml.safe_load(path.read_text()) for path in EXAMPLES), model("m", ENV, affinity=AFFINITY)],
    ids=[*(path.name for path in EXAMPLES), "free-form"],
)
def test_what_is_rendered_is_valid_for_the_oldest_kubernetes(body: dict[str, Any]) -> None:
    for manifest in render(body, podmonitor_api=False):
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


NODE = "spec.affinity.nodeAffinity"
WRONG: dict[str, tuple[dict[str, Any], str]] = {
    "a-number-for-an-object": (
        model("bad", affinity={"nodeAffinity": 5}),
        f'{NODE}: Invalid value: "integer": {NODE} in body must be of type object: "integer"',
    ),
    "a-misspelt-field": (
        model("bad", affinity={"nodeAffinity": {"requiredDuringScheduling": {}}}),
        f"{NODE}.requiredDuringScheduling: field not declared in schema",
    ),
    "a-required-field-missing": (
        model(
            "bad", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
        ),
        f"{NODE}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Required value",
    ),
    "an-object-for-a-list": (
        model(
            "bad",
            affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {}}},
        ),
        "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution: "
        'Invalid value: "object": ',
    ),
    "deep-in-a-list": (
        model(
            "bad",
            affinity={
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"tier": 1}}}
                    ]
                }
            },
        ),
        "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        '.labelSelector.matchLabels.tier: Invalid value: "integer": ',
    ),
    "a-secret-reference-without-key": (
        model("bad", [ENV[0], {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        "spec.model.env[1].valueFrom.secretKeyRef.key: Required value",
    ),
    "an-unknown-source": (
        model("bad", [{"name": "T", "valueFrom": {"vaultRef": {"path": "x"}}}]),
        "spec.model.env[0].valueFrom.vaultRef: field not declared in schema",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_free_form_mistake_is_refused_naming_the_field(tmp_path: Path, case: str) -> None:
    body, problem = WRONG[case]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    result = carpool_render(path)
    assert result.returncode == 2, result.stdout[:300]
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"bad: {problem}"), line


def test_good_free_form_parts_are_rendered_as_written(tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(model("good", ENV, affinity=AFFINITY)))
    result = carpool_render(path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    (deployment,) = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["affinity"] == AFFINITY
    env = {variable["name"]: variable for variable in pod["containers"][0]["env"]}
    assert env["TOKEN"]["valueFrom"] == ENV[1]["valueFrom"]


HIDE_KUBERNETES_VALIDATE = "import sys; sys.modules['kubernetes_validate'] = None"


def test_without_kubernetes_validate_render_says_what_it_did_not_check(tmp_path: Path) -> None:
    path = tmp_path / "unchecked.yaml"
    path.write_text(yaml.safe_dump(model("unchecked", ENV, affinity={"nodeAffinity": 5})))
    result = carpool_render(path, HIDE_KUBERNETES_VALIDATE)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "Warning: spec.affinity, spec.model.env[].valueFrom not checked against Kubernetes "
        f"{KUBERNETES_VERSION}'s schemas: install carpool-operator[validate] "
        "(kubernetes-validate) to check them"
    ]
    assert "Deployment" in result.stdout

    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(model("plain")))
    result = carpool_render(plain, HIDE_KUBERNETES_VALIDATE)
    assert (result.returncode, result.stderr) == (0, "")
