"""Each change the operator makes to a model's children is told once, whatever follows it.

Each Event the operator posts is a new object: the API server keeps two identical ones as two,
and `kubectl describe bm` lists both. Here a reconcile runs in process against the test API
server (see support.heard) and something goes wrong just after a change landed; the judgment
made again in the same pass, or kopf's retry of the handler, must not tell of it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest
from support.heard import LOG, Heard, client_of, live, made, served_with_crd
from support.kube_api import ServedKubeApi
from support.kube_http import call

from carpool_operator.handover import HANDOVER_MANAGER
from carpool_operator.kube import RESOURCES, KubeClient
from carpool_operator.reconcile import reconcile
from carpool_operator.types import Manifest

MERGE = "application/merge-patch+json"
AUTOSCALED = {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8}}


@pytest.fixture
async def api() -> AsyncIterator[tuple[ServedKubeApi, KubeClient]]:
    with served_with_crd() as served:
        async with client_of(served) as kube:
            yield served, kube


class HeardHandOver(Heard):
    """A cache that, once the hand-over's write lands, lets something else happen."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube)
        self.then: Callable[[], None] | None = None

    def wrote(self, found: Manifest) -> None:
        super().wrote(found)
        managers = {entry["manager"] for entry in found["metadata"].get("managedFields", [])}
        if self.then is not None and HANDOVER_MANAGER in managers:
            then, self.then = self.then, None
            then()


def events(served: ServedKubeApi, reason: str) -> list[dict[str, Any]]:
    _, found = call(served, "GET", RESOURCES["Event"].path("default"))
    return [item for item in found["items"] if item["reason"] == reason]


def hand_overs(served: ServedKubeApi, name: str) -> int:
    """The hand-over manager's writes to the Deployment."""
    path = RESOURCES["Deployment"].path("default", name)
    manager = f"fieldManager={HANDOVER_MANAGER}"
    return sum(1 for r in served.api.records if r.path == path and manager in r.query)


def replicas_owners(deployment: dict[str, Any]) -> set[str]:
    return {
        entry["manager"]
        for entry in deployment["metadata"]["managedFields"]
        if "f:replicas" in entry["fieldsV1"].get("f:spec", {})
    }


@pytest.mark.parametrize("refusal", ["conflict", "unavailable"])
async def test_a_hand_over_whose_apply_is_refused_is_told_once(
    api: tuple[ServedKubeApi, KubeClient], refusal: str
) -> None:
    """Turning autoscaling on hands the Deployment's count to carpool's hand-over manager, then
    applies the Deployment without it (handover.py). Between the two, the Deployment's apply is
    refused: 409, as the Deployment controller wrote its status meanwhile (the pass judges the
    Deployment again), or 503 (kopf retries the handler). The count changes hands with one
    write, told in one event."""
    served, kube = api
    name = f"handed-{refusal}"
    heard = HeardHandOver(kube)
    runtime, _ = await made(served, kube, name, heard, replicas=4)
    deployment = RESOURCES["Deployment"].path("default", name)

    def deployment_controller() -> None:
        status = {"status": {"observedGeneration": 1, "replicas": 4}}
        assert call(served, "PATCH", f"{deployment}/status", status, MERGE)[0] == 200

    def unavailable() -> None:
        served.api.fail("PATCH", deployment, code=503)

    heard.then = deployment_controller if refusal == "conflict" else unavailable
    path = RESOURCES["BatchedModel"].path("default", name)
    assert call(served, "PATCH", path, {"spec": AUTOSCALED}, MERGE)[0] == 200
    await heard.hear("BatchedModel", name)

    if refusal == "unavailable":
        with pytest.raises(kopf.TemporaryError):
            await reconcile(runtime, "default", name, LOG)
    await reconcile(runtime, "default", name, LOG)
    assert heard.then is None, "the hand-over never happened"

    found = live(served, "Deployment", name)
    assert found is not None
    assert found["spec"]["replicas"] == 4
    assert replicas_owners(found) == {HANDOVER_MANAGER}
    told = events(served, "ReplicasHandedOver")
    assert [event["message"] for event in told] == [
        f"Deployment {name} keeps its 4 replicas until the autoscaler sets them"
    ]
    assert hand_overs(served, name) == 1


async def test_a_child_deleted_is_told_once_though_a_late_watch_event_brings_it_back(
    api: tuple[ServedKubeApi, KubeClient],
) -> None:
    """From 2 replicas to 1, the disruption budget goes. A watch that lags then tells of the
    budget as it was before the delete (the cache keeps it again until the DELETED event
    comes), and the pass that event asks for finds it gone: nothing more to tell."""
    served, kube = api
    runtime, heard = await made(served, kube, "shrunk", replicas=2)
    budget = live(served, "PodDisruptionBudget", "shrunk")
    assert budget is not None
    path = RESOURCES["BatchedModel"].path("default", "shrunk")
    assert call(served, "PATCH", path, {"spec": {"replicas": 1}}, MERGE)[0] == 200
    await heard.hear("BatchedModel", "shrunk")
    await reconcile(runtime, "default", "shrunk", LOG)
    assert live(served, "PodDisruptionBudget", "shrunk") is None

    heard.wrote(budget)
    await reconcile(runtime, "default", "shrunk", LOG)
    told = events(served, "ChildDeleted")
    assert [event["message"] for event in told] == ["deleted PodDisruptionBudget shrunk"]
