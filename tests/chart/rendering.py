"""Run the real helm binary on the chart and parse what it renders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support.kube_cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "carpool"
TOOLS = REPO / ".cache" / "tools" / "bin"
HELM = TOOLS / "helm"
NAMESPACE = "carpool-system"
RELEASE = "carpool"

# Each values variant under ci/ is linted, rendered and validated like the defaults.
VARIANTS: list[Path] = sorted((CHART / "ci").glob("*-values.yaml"))

Manifest = dict[str, Any]


def helm(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    """Run helm; fail with its stderr, which names the template and line at fault."""
    done = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def render(*values_files: Path, sets: tuple[str, ...] = ()) -> list[Manifest]:
    """`helm template` the chart and return its manifests, empty documents dropped."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for values in values_files:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(helm(*args)) if doc]


def by_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def run_helm(cluster: Cluster, *args: str) -> str:
    """helm against `cluster`, its caches under the test's folder, never in the user's home."""
    home = cluster.kubeconfig.parent / "helm-home"
    env = dict(
        os.environ,
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    return helm(*args, "--kubeconfig", str(cluster.kubeconfig), env=env, timeout=120)
