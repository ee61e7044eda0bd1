"""The operator against an API server that fails requests, loses replies and drops watches.

One implementation for the quick test (`test_operator_faults.py`) and the soak
(`bench/soak.py operator`): `run(folder, Plan(...))` creates, edits and breaks BatchedModels
while faults are on, turns the faults off, and measures how long the operator takes to bring
every child and status in line, then counts its writes over quiet resyncs (there must be none).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.fault_api import Chaos, FaultyServedKubeApi
from support.kube_api import WRITE_METHODS
from support.kube_cluster import CRD, OPERATOR_AGENT, Cluster, free_port, run_operator
from support.kube_models import wait_resyncs

from carpool_operator.diff import contains
from carpool_operator.render import render

CHILD_KINDS = "deployments,services,configmaps,poddisruptionbudgets"
OPERATOR_AGENTS = (OPERATOR_AGENT, "kopf")  # the operator's child client and kopf itself


@dataclass(frozen=True)
class Plan:
    models: int = 3
    chaos_seconds: float = 6.0
    fault_rate: float = 0.3
    drop_watches_every_s: float = 1.5
    converge_timeout_s: float = 60.0
    quiet_resyncs: int = 3
    settle_s: float = 6.0  # no write for this long before the quiet resyncs are counted
    seed: int = 1


@dataclass
class Report:
    injected: Counter[tuple[str, int]] = field(default_factory=Counter)
    lost_replies: int = 0
    dropped_watches: int = 0
    converge_seconds: float = 0.0
    writes_during_chaos: int = 0
    writes_on_quiet_resync: int = -1
    quiet_writes: list[str] = field(default_factory=list)
    operator_exit_code: int | None = None
    problems: list[str] = field(default_factory=list)


def model(name: str, replicas: int, max_batch_size: int) -> dict[str, Any]:
    return {
        "apiVersion": "carpool.dev/v1alpha1",
        "kind": "BatchedModel",
        "metadata": {"name": name},
        "spec": {
            "model": {"handler": "toy", "device": "cpu"},
            "replicas": replicas,
            "batching": {"maxBatchSize": max_batch_size},
        },
    }


def problems(cluster: Cluster, names: list[str]) -> list[str]:
    """What still differs from the desired state: children, owners, status. Empty: converged."""
    found: list[str] = []
    listing = cluster.kubectl("get", CHILD_KINDS, "-o", "json").stdout
    children = json.loads(listing)["items"]
    for name in names:
        owner = cluster.get("bm", name)
        if owner is None:
            found.append(f"{name}: BatchedModel missing")
            continue
        uid = owner["metadata"]["uid"]
        owned = {
            (child["kind"], child["metadata"]["name"]): child
            for child in children
            for ref in child["metadata"].get("ownerReferences", [])
            if ref["uid"] == uid and ref.get("controller")
        }
        wanted = {(m["kind"], m["metadata"]["name"]): m for m in render(owner)}
        for key in wanted.keys() - owned.keys():
            found.append(f"{name}: {key} missing")
        for key in owned.keys() - wanted.keys():
            found.append(f"{name}: {key} left over")
        for key in wanted.keys() & owned.keys():
            if not contains(owned[key], wanted[key]):
                found.append(f"{name}: {key} differs from its rendering")
            refs = owned[key]["metadata"]["ownerReferences"]
            if len(refs) != 1:
                found.append(f"{name}: {key} has {len(refs)} owner references")
        found += _status_problems(owner)
    return found


def _status_problems(owner: dict[str, Any]) -> list[str]:
    name = owner["metadata"]["name"]
    status = owner.get("status", {})
    replicas = owner["spec"]["replicas"]
    conditions = {item["type"]: item for item in status.get("conditions", [])}
    expected = {
        "observedGeneration": owner["metadata"]["generation"],
        "replicasReady": f"{replicas}/{replicas}",
        "Ready": ("True", "ReplicasReady"),
        "Degraded": ("False", "AsExpected"),
    }
    actual = {
        "observedGeneration": status.get("observedGeneration"),
        "replicasReady": status.get("replicasReady"),
        "Ready": (
            conditions.get("Ready", {}).get("status"),
            conditions.get("Ready", {}).get("reason"),
        ),
        "Degraded": (
            conditions.get("Degraded", {}).get("status"),
            conditions.get("Degraded", {}).get("reason"),
        ),
    }
    return [
        f"{name}: status {key} is {actual[key]!r}, want {value!r}"
        for key, value in expected.items()
        if actual[key] != value
    ]


def fake_rollouts(cluster: Cluster, names: list[str]) -> None:
    """Report every Deployment fully ready, as its controller would (the test API has none)."""
    for name in names:
        deployment = cluster.get("deployment", name)
        if deployment is None:
            continue
        replicas = deployment["spec"]["replicas"]
        status = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }
        if deployment.get("status", {}) == status:
            continue
        cluster.kubectl(
            "patch", "deployment", name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip


def _settle(served: FaultyServedKubeApi, quiet_s: float, deadline: float) -> bool:
    """Wait until no write has arrived for `quiet_s` seconds; False at the deadline."""
    writes, since = served.api.write_count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = served.api.write_count()
        if now != writes:
            writes, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return True
    return False


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    names = [f"chaos-{index}" for index in range(plan.models)]
    with FaultyServedKubeApi(seed=plan.seed) as served:
        kubeconfig = served.write_kubeconfig(folder / "kubeconfig")
        cluster = Cluster(kubeconfig, "default", served.api, free_port())
        cluster.kubectl("apply", "-f", str(CRD))
        log = folder / "operator.log"
        port = cluster.operator_metrics_port
        with run_operator(kubeconfig, "default", log, metrics_port=port) as operator:
            writes_before = served.api.write_count(agent=OPERATOR_AGENT)
            served.api.chaos = Chaos(rate=plan.fault_rate, agents=OPERATOR_AGENTS)
            _disturb(cluster, served, names, plan)
            served.api.chaos = None
            report.writes_during_chaos = (
                served.api.write_count(agent=OPERATOR_AGENT) - writes_before
            )

            calm = time.monotonic()
            deadline = calm + plan.converge_timeout_s
            while True:
                fake_rollouts(cluster, names)
                report.problems = problems(cluster, names)
                if not report.problems or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            report.converge_seconds = time.monotonic() - calm
            report.injected = Counter(served.api.injected)
            report.lost_replies = served.api.lost_replies
            report.dropped_watches = served.api.dropped_watches
            report.operator_exit_code = operator.poll()
            if report.problems:
                return report

            # A handler that failed late in the faults may still be waiting out its retry delay
            # (5 s); its retry and kopf's bookkeeping of it are writes, but not a resync's.
            if not _settle(served, plan.settle_s, deadline):
                report.problems = [f"writes never stopped for {plan.settle_s}s"]
                return report
            start = len(served.api.records)
            wait_resyncs(cluster, plan.quiet_resyncs)
            report.quiet_writes = [
                f"{r.method} {r.path} ({r.agent})"
                for r in served.api.records[start:]
                if r.method in WRITE_METHODS
            ]
            report.writes_on_quiet_resync = len(report.quiet_writes)
    return report


def _disturb(cluster: Cluster, served: FaultyServedKubeApi, names: list[str], plan: Plan) -> None:
    """Create, edit and damage models while faults are on and watches drop on a beat."""
    # Half start with two replicas (so they get a disruption budget) and drop to one later.
    with _dropping_watches(served, plan.drop_watches_every_s):
        for index, name in enumerate(names):
            cluster.apply(model(name, replicas=2 if index % 2 == 0 else 1, max_batch_size=8))
        steps = [
            *(("edit", name) for name in names),
            *(("delete-deployment", name) for name in names[::3]),
            *(("edit-service", name) for name in names[1::3]),
        ]
        gap = plan.chaos_seconds / (len(steps) + 1)
        for action, name in steps:
            time.sleep(gap)
            if action == "edit":
                cluster.apply(model(name, replicas=1, max_batch_size=16))
            elif action == "delete-deployment":
                cluster.kubectl("delete", "deployment", name, "--wait=false", check=False)
            else:
                ports = [{"name": "http", "port": 9999, "targetPort": "http", "protocol": "TCP"}]
                patch = json.dumps({"spec": {"ports": ports}})
                cluster.kubectl("patch", "service", name, "--type=merge", "-p", patch, check=False)
        time.sleep(gap)


@contextlib.contextmanager
def _dropping_watches(served: FaultyServedKubeApi, every_s: float) -> Iterator[None]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            served.drop_watches()

    thread = threading.Thread(target=beat, name="drop-watches")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def summary(report: Report) -> str:
    faults = ", ".join(f"{m} {c}: {n}" for (m, c), n in sorted(report.injected.items()))
    return (
        f"injected faults: {sum(report.injected.values())} ({faults}); lost replies: "
        f"{report.lost_replies}; dropped watches: {report.dropped_watches}; operator writes "
        f"while faulty: {report.writes_during_chaos}; converged {report.converge_seconds:.1f}s "
        f"after the faults stopped; writes over quiet resyncs: {report.writes_on_quiet_resync}; "
        f"operator exit code: {report.operator_exit_code} (None: still running)"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if report.operator_exit_code is not None:
        broken.append(f"the operator exited with {report.operator_exit_code}")
    broken += report.problems
    codes = {code for _, code in report.injected}
    if not {409, 500} <= codes or not report.lost_replies or not report.dropped_watches:
        broken.append("the faults did not all happen: the scenario proved nothing")
    if report.writes_on_quiet_resync != 0:
        broken.append(f"writes over quiet resyncs: {report.quiet_writes}")
    return broken
