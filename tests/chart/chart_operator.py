"""The real operator, run with the command, args and env of the chart's Deployment.

Only the listeners move: liveness and /metrics go to free ports on 127.0.0.1 (in a pod they
listen on 0.0.0.0), so that tests can run side by side.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chart.rendering import Manifest, one
from support.kube_cluster import Cluster, free_port

from carpool import processes


@dataclass(frozen=True)
class ChartOperator:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:]


def _local(arg: str, liveness_port: int, metrics_port: int) -> str:
    if arg.startswith("--liveness"):
        return f"--liveness=http://127.0.0.1:{liveness_port}/healthz"
    if arg.startswith("--metrics-host"):
        return "--metrics-host=127.0.0.1"
    if arg.startswith("--metrics-port"):
        return f"--metrics-port={metrics_port}"
    return arg


def command_and_env(
    manifests: list[Manifest], kubeconfig: Path, liveness_port: int, metrics_port: int
) -> tuple[list[str], dict[str, str]]:
    deployment = one(manifests, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["carpool", "operator"]
    args = [_local(arg, liveness_port, metrics_port) for arg in container["args"]]
    env = {item["name"]: item["value"] for item in container["env"]}
    env.update(CARPOOL_RESYNC_SECONDS="1", KUBECONFIG=str(kubeconfig))
    return [sys.executable, "-m", "carpool", "operator", *args], {**os.environ, **env}


def _live(port: int, operator: ChartOperator) -> bool:
    if operator.process.poll() is not None:
        raise AssertionError(f"the operator exited:\n{operator.log_tail()}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def run_chart_operator(
    manifests: list[Manifest], cluster: Cluster, log: Path
) -> Iterator[ChartOperator]:
    """The operator as `manifests` (a `helm template` output) run it; live when yielded."""
    liveness_port, metrics_port = free_port(), free_port()
    command, env = command_and_env(manifests, cluster.kubeconfig, liveness_port, metrics_port)
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    operator = ChartOperator(process, log, metrics_port)
    try:
        cluster.wait_for("the operator's liveness", lambda: _live(liveness_port, operator))
        yield operator
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{operator.log_tail()}") from error
    finally:
        processes.stop(process, timeout_s=15)
