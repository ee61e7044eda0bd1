"""Security scans of everything carpool puts in a cluster: the chart's manifests and the pods
the operator renders for each example BatchedModel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.pod_security import pod_spec_of, violations
from chart.rendering import CHART, REPO, TOOLS, VARIANTS, Manifest, one, render

CHECKOV = TOOLS / "checkov"
# --skip-download: no calls home for guidelines (tests run offline).
CHECKOV_FLAGS = ("--output", "json", "--quiet", "--compact", "--skip-download")
SKIPS: dict[str, dict[str, str]] = yaml.safe_load(
    (Path(__file__).parent / "checkov_skips.yaml").read_text()
)
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Rendered into a namespace of their own: the examples' `default` is a demo choice.
EXAMPLE_NAMESPACE = "models"


@pytest.fixture(scope="module")
def chart_renders() -> dict[str, list[Manifest]]:
    renders = {"defaults": render()}
    renders.update({path.stem: render(path) for path in VARIANTS})
    return renders


@pytest.fixture(scope="module")
def operator_renders() -> dict[str, list[Manifest]]:
    """`python -m carpool render` of every example, the way a user previews them."""
    renders: dict[str, list[Manifest]] = {}
    for example in EXAMPLES:
        documents = [doc for doc in yaml.safe_load_all(example.read_text()) if doc]
        for document in documents:
            document["metadata"]["namespace"] = EXAMPLE_NAMESPACE
        done = subprocess.run(
            [sys.executable, "-m", "carpool", "render", "-f", "-", "--podmonitor"],
            input=yaml.safe_dump_all(documents),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"carpool render -f {example.name}: {done.stderr}"
        renders[example.stem] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return renders


def checkov_failures(renders: dict[str, list[Manifest]], folder: Path) -> dict[str, list[str]]:
    """Run checkov on the rendered YAML; map each failed check id to the resources failing it."""
    folder.mkdir()
    for name, manifests in renders.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump_all(manifests))
    done = subprocess.run(
        [str(CHECKOV), "--directory", str(folder), "--framework", "kubernetes", *CHECKOV_FLAGS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Exit code 1 means "some check failed"; anything else is checkov itself failing.
    assert done.returncode in {0, 1}, done.stderr[-2000:]
    report: Any = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    assert sum(r["summary"]["passed"] for r in reports) > 0, "checkov checked nothing"
    failed: dict[str, list[str]] = {}
    for part in reports:
        for check in part["results"]["failed_checks"]:
            failed.setdefault(check["check_id"], []).append(
                f"{check['file_path']}: {check['resource']} ({check['check_name']})"
            )
    return failed


def assert_only_skipped(failed: dict[str, list[str]], scope: str) -> None:
    skips = SKIPS[scope]
    unexpected = {check: where for check, where in failed.items() if check not in skips}
    assert not unexpected, "checkov checks failed without a reason in checkov_skips.yaml:\n" + (
        "\n".join(f"{check}: {line}" for check, lines in unexpected.items() for line in lines)
    )
    stale = sorted(set(skips) - set(failed))
    assert not stale, f"checkov_skips.yaml {scope} lists checks that now pass: {stale}"


def test_checkov_passes_the_chart(chart_renders: dict[str, list[Manifest]], tmp_path: Path) -> None:
    assert_only_skipped(checkov_failures(chart_renders, tmp_path / "chart"), "chart")


@pytest.mark.skipif(not EXAMPLES, reason="no examples/*.yaml to render")
def test_checkov_passes_the_operator_manifests(
    operator_renders: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    failed = checkov_failures(operator_renders, tmp_path / "operator")
    assert_only_skipped(failed, "batchedmodel")


def test_chart_pods_meet_the_restricted_pod_security_standard(
    chart_renders: dict[str, list[Manifest]],
) -> None:
    for variant, manifests in chart_renders.items():
        pods = [spec for m in manifests if (spec := pod_spec_of(m)) is not None]
        assert pods, variant
        for pod in pods:
            assert violations(pod) == [], variant
        (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.skipif(not EXAMPLES, reason="no examples/*.yaml to render")
def test_operator_pods_meet_the_restricted_pod_security_standard(
    operator_renders: dict[str, list[Manifest]],
) -> None:
    for example, manifests in operator_renders.items():
        pods = [spec for m in manifests if (spec := pod_spec_of(m)) is not None]
        assert pods, f"{example} renders no pod"
        for pod in pods:
            assert violations(pod) == [], example


def test_the_checker_catches_each_restricted_rule() -> None:
    """The checker must fail the pods the restricted profile forbids, rule by rule."""
    good: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "app",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    assert violations(good) == []

    def broken(path: str, value: object) -> list[str]:
        pod = json.loads(json.dumps(good))
        *parents, leaf = path.split(".")
        node = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[leaf] = value
        return violations(pod)

    container = "containers.0.securityContext"
    cases = {
        "hostNetwork": ("hostNetwork", True),
        "privileged": (f"{container}.privileged", True),
        "allowPrivilegeEscalation": (f"{container}.allowPrivilegeEscalation", True),
        "runAsNonRoot": ("securityContext.runAsNonRoot", False),
        "runAsUser": (f"{container}.runAsUser", 0),
        "seccompProfile": ("securityContext.seccompProfile", {"type": "Unconfined"}),
        "capabilities.drop": (f"{container}.capabilities", {"drop": ["NET_RAW"]}),
        "capabilities.add": (
            f"{container}.capabilities",
            {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        ),
        "hostPath": ("volumes", [{"name": "host", "hostPath": {"path": "/"}}]),
        "hostPort": ("containers.0.ports", [{"containerPort": 80, "hostPort": 80}]),
        "sysctl": ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
    }
    for rule, (path, value) in cases.items():
        assert broken(path, value), f"the checker let {rule} through"


def test_cluster_role_is_least_privilege() -> None:
    """The rules, no wildcards, each explained (test_operator_rbac.py proves them exact)."""
    role = one(render(), "ClusterRole")
    granted = {
        (group, resource): tuple(sorted(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    # get: once before creating a child, which the label-filtered cache cannot rule out.
    applied = tuple(sorted(["get", "list", "watch", "create", "patch"]))
    optional = tuple(sorted(["get", "list", "watch", "create", "patch", "delete"]))
    assert granted == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch"),
        ("", "events"): ("create",),
        ("carpool.dev", "batchedmodels"): ("list", "patch", "watch"),
        ("carpool.dev", "batchedmodels/status"): ("patch",),
        ("carpool.dev", "batchedmodels/finalizers"): ("update",),
        ("apps", "deployments"): applied,
        ("", "services"): applied,
        ("", "configmaps"): applied,
        ("", "pods"): ("list", "watch"),
        # No secrets: a get would read every Secret's data; a missing one shows on the pods.
        ("policy", "poddisruptionbudgets"): optional,
        ("autoscaling", "horizontalpodautoscalers"): optional,
        ("monitoring.coreos.com", "podmonitors"): optional,
    }
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "resourceNames" not in rule or rule["resourceNames"]

    template = (CHART / "templates" / "clusterrole.yaml").read_text()
    lines = template.splitlines()
    for number, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            previous = lines[number - 1].strip()
            assert previous.startswith("#") or previous.startswith("verbs:"), (
                f"clusterrole.yaml line {number + 1}: a rule without a comment saying why"
            )
