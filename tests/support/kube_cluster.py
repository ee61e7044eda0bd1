"""One harness for the operator's end-to-end scenarios, on the test API server or a real cluster.

A `Cluster` runs the real kubectl against a kubeconfig and, on the test API server, also sees
the server's request log (`api`); a real cluster has `api = None`. `run_operator` starts
`python -m carpool operator` as a subprocess pointed at the same kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from carpool import processes
from carpool.processes import free_port
from support.kube_api import KubeApiServer

__all__ = ["free_port"]  # re-exported: tests import it from here

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache" / "tools" / "bin" / "kubectl"
CRD = ROOT / "crds" / "batchedmodels.carpool.dev.yaml"
OPERATOR_AGENT = "carpool-operator"
T = TypeVar("T")


@dataclass
class Cluster:
    kubeconfig: Path
    namespace: str
    api: KubeApiServer | None = None  # the test API server, None on a real cluster
    operator_metrics_port: int = 0  # where the operator under test serves /metrics

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        command = [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args]
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-o", "json", "--ignore-not-found", check=False)
        if result.returncode != 0:
            raise AssertionError(f"kubectl get {kind} {name} failed: {result.stderr}")
        found: dict[str, Any] | None = json.loads(result.stdout) if result.stdout.strip() else None
        return found

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
        """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)

    def wait_for_object(
        self, kind: str, name: str, check: Callable[[dict[str, Any]], bool] = bool
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            found = self.get(kind, name)
            return found if found is not None and check(found) else None

        return self.wait_for(f"{kind} {name}", probe)

    def wait_gone(self, kind: str, name: str) -> None:
        self.wait_for(f"{kind} {name} to be gone", lambda: self.get(kind, name) is None)


@contextlib.contextmanager
def run_operator(
    kubeconfig: Path,
    namespace: str,
    log: Path,
    *,
    resync_seconds: float = 1.0,
    metrics_port: int = 0,
) -> Iterator[subprocess.Popen[bytes]]:
    """The real operator in a subprocess; ready once its liveness endpoint answers.

    Its /metrics listens on 127.0.0.1:`metrics_port`; 0 (the default) turns it off.
    """
    port = free_port()
    command = processes.carpool_command(
        "operator", "--standalone",
        "--namespace", namespace,
        "--liveness", f"http://127.0.0.1:{port}/healthz",
        "--metrics-host", "127.0.0.1",
        "--metrics-port", str(metrics_port),
        "--resync-seconds", str(resync_seconds),
    )  # fmt: skip
    process = processes.spawn(command, log, {"KUBECONFIG": str(kubeconfig)})
    try:
        live = f"http://127.0.0.1:{port}/healthz"
        try:
            processes.wait_ready([process], lambda: processes.http_ok(live), 60, "the operator")
        except processes.NotReady as error:
            raise AssertionError(f"{error}: {log.read_text()[-2000:]}") from None
        yield process
    finally:
        processes.stop(process, timeout_s=15)
