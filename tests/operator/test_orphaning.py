"""A reconcile that races an orphaning delete leaves the children the user kept alone.

`kubectl delete bm NAME --cascade=orphan` keeps the children: the garbage collector takes the
model's owner reference off them, then the model goes. The operator reads from its cache, whose
watches (one per kind) may tell of that later than it happened; a reconcile that then wrote a
child with the owner reference again would hand it back to the garbage collector, which deletes
a dependent whose owner is gone. Here the reconcile runs in process against the test API server,
with a cache that heard of some writes and not yet of others.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.heard import LOG, Heard, children, client_of, live, made, served_with_crd
from support.kube_api import ServedKubeApi
from support.kube_cluster import OPERATOR_AGENT
from support.kube_http import call

from carpool_operator.kube import RESOURCES, KubeClient
from carpool_operator.reconcile import reconcile

MERGE = "application/merge-patch+json"
ORPHAN = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}


@pytest.fixture
def served() -> Iterator[ServedKubeApi]:
    with served_with_crd() as server:
        yield server


@pytest.fixture
async def kube(served: ServedKubeApi) -> AsyncIterator[KubeClient]:
    async with client_of(served) as client:
        yield client


def assert_kept(served: ServedKubeApi, before: dict[str, dict[str, Any]], name: str) -> None:
    """Every child is there, the same object, and nobody's: the garbage collector leaves it."""
    for kind, child in children(name):
        found = live(served, kind, child)
        assert found is not None, f"{kind} {child} was collected"
        assert found["metadata"]["uid"] == before[kind]["metadata"]["uid"], kind
        assert not found["metadata"].get("ownerReferences"), (kind, found["metadata"])


async def test_a_change_applied_after_an_orphaning_delete_leaves_the_children_kept(
    served: ServedKubeApi, kube: KubeClient
) -> None:
    """The cache heard of a new image, not yet of the orphaning delete that followed it: the
    apply of a child, judged against the child as it was, is refused; judged again as the API
    server has it, the child is an orphan whose model is going, and the pass ends."""
    runtime, heard = await made(served, kube, "changed")
    before = {kind: live(served, kind, child) or {} for kind, child in children("changed")}
    path = RESOURCES["BatchedModel"].path("default", "changed")
    image = {"spec": {"model": {"image": "registry.example.com/team/carpool:0.3.0"}}}
    assert call(served, "PATCH", path, image, MERGE)[0] == 200
    await heard.hear("BatchedModel", "changed")
    assert call(served, "DELETE", path, ORPHAN)[0] == 200

    await reconcile(runtime, "default", "changed", LOG)
    assert_kept(served, before, "changed")

    # The retry, once the cache heard of it all, writes nothing.
    writes = served.api.write_count(agent=OPERATOR_AGENT)
    for kind, child in [("BatchedModel", "changed"), *children("changed")]:
        await heard.hear(kind, child)
    await reconcile(runtime, "default", "changed", LOG)
    assert served.api.write_count(agent=OPERATOR_AGENT) == writes
    assert_kept(served, before, "changed")


async def test_children_heard_orphaned_before_their_models_deletion_are_not_taken_back(
    served: ServedKubeApi, kube: KubeClient
) -> None:
    """The children's watches told of the orphaning, the model's not yet of its deletion: the
    children look like orphans to adopt, but the model they would go to is gone."""
    runtime, heard = await made(served, kube, "lagged")
    before = {kind: live(served, kind, child) or {} for kind, child in children("lagged")}
    path = RESOURCES["BatchedModel"].path("default", "lagged")
    assert call(served, "DELETE", path, ORPHAN)[0] == 200
    for kind, child in children("lagged"):
        await heard.hear(kind, child)

    writes = served.api.write_count(agent=OPERATOR_AGENT)
    await reconcile(runtime, "default", "lagged", LOG)
    assert_kept(served, before, "lagged")
    assert served.api.write_count(agent=OPERATOR_AGENT) == writes


async def test_a_change_applied_over_a_child_the_cache_lags_behind_lands_in_one_pass(
    served: ServedKubeApi, kube: KubeClient
) -> None:
    """Someone else wrote the Deployment since its watch last told the cache (a watch that
    lags): the apply judged against the stale child is refused (409), and the same pass
    judges it again as the API server has it and applies, rather than leaving the change to
    a retry seconds later."""
    runtime, heard = await made(served, kube, "lagging")
    path = RESOURCES["Deployment"].path("default", "lagging")
    annotated = {"metadata": {"annotations": {"team.example.com/owner": "search"}}}
    assert call(served, "PATCH", path, annotated, MERGE)[0] == 200  # unheard by the cache
    model_path = RESOURCES["BatchedModel"].path("default", "lagging")
    image = "registry.example.com/team/carpool:0.3.0"
    assert call(served, "PATCH", model_path, {"spec": {"model": {"image": image}}}, MERGE)[0] == 200
    await heard.hear("BatchedModel", "lagging")

    await reconcile(runtime, "default", "lagging", LOG)
    found = live(served, "Deployment", "lagging")
    assert found is not None
    images = [each["image"] for each in found["spec"]["template"]["spec"]["containers"]]
    assert image in images
    assert found["metadata"]["annotations"]["team.example.com/owner"] == "search"
    assert found["metadata"]["ownerReferences"]


async def test_a_child_the_spec_dropped_is_not_deleted_once_an_orphaning_delete_kept_it(
    served: ServedKubeApi, kube: KubeClient
) -> None:
    """The cache heard of the model going from 2 replicas to 1 (so no disruption budget),
    not yet of the orphaning delete that followed: the budget, judged the model's from the
    cache, is the user's by now, and is not deleted."""
    runtime, _ = await made(served, kube, "shrunk", replicas=2)
    budget = live(served, "PodDisruptionBudget", "shrunk")
    assert budget is not None and budget["metadata"]["ownerReferences"]
    path = RESOURCES["BatchedModel"].path("default", "shrunk")
    assert call(served, "PATCH", path, {"spec": {"replicas": 1}}, MERGE)[0] == 200
    heard = kube.store
    assert isinstance(heard, Heard)
    await heard.hear("BatchedModel", "shrunk")
    assert call(served, "DELETE", path, ORPHAN)[0] == 200

    await reconcile(runtime, "default", "shrunk", LOG)
    kept = live(served, "PodDisruptionBudget", "shrunk")
    assert kept is not None, "the kept budget was deleted"
    assert kept["metadata"]["uid"] == budget["metadata"]["uid"]
    assert not kept["metadata"].get("ownerReferences")
