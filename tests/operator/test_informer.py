"""The operator's watches keep its cache current against the test API server.

A watch that drops is resumed from the last version, without a new list; one whose version the
server forgot (410 Expired) lists again; a kind the cluster lacks, or the operator may not
list, holds nothing and is listed again once it is there or granted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest
from support.fault_api import FaultyServedKubeApi
from support.kube_api import Kind
from support.kube_http import call
from support.kube_rbac import binding

from carpool_operator.cache import MANAGED
from carpool_operator.informer import Informer, State
from carpool_operator.kube import ApiError, KubeClient
from carpool_operator.types import Manifest

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
LABELS = {"app.kubernetes.io/managed-by": "carpool"}


class Watched:
    """An informer running against a served test API server, and the changes it heard."""

    def __init__(self, served: FaultyServedKubeApi, kind: str, token: str = "") -> None:
        self.served = served
        self.kube = KubeClient()
        self.kube.login(kopf.ConnectionInfo(server=served.url, token=token or None))
        self.changes: list[tuple[str, str]] = []
        self.informer = Informer(
            self.kube, kind, "default", MANAGED, lambda _: True, self._heard, retry_s=0.2
        )

    def _heard(self, kind: str, found: Manifest) -> None:
        self.changes.append((kind, found["metadata"]["name"]))

    def lists(self) -> int:
        """The informer's lists so far (its watches are GETs of the same path)."""
        path = self.informer._path
        return sum(
            1
            for record in list(self.served.api.records)
            if (record.method, record.path) == ("GET", path) and "watch=true" not in record.query
        )


@pytest.fixture
async def watched() -> AsyncIterator[Watched]:
    with FaultyServedKubeApi() as served:
        watched = Watched(served, "ConfigMap")
        task = asyncio.create_task(watched.informer.run())
        try:
            yield watched
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await watched.kube.close()


async def eventually(what: str, probe: Callable[[], Any]) -> None:
    for _ in range(200):
        if probe():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def create(served: FaultyServedKubeApi, name: str, labels: dict[str, str] = LABELS) -> None:
    status, _ = call(served, "POST", CONFIGMAPS, {"metadata": {"name": name, "labels": labels}})
    assert status == 201


async def test_a_dropped_watch_resumes_without_listing_again(watched: Watched) -> None:
    assert await watched.informer.ready() is State.LISTED
    create(watched.served, "first")
    create(watched.served, "someone-elses", labels={})
    await eventually("first", lambda: watched.informer.get("default", "first"))
    watched.served.drop_watches()
    create(watched.served, "second")
    await eventually("second", lambda: watched.informer.get("default", "second"))
    assert watched.lists() == 1
    assert watched.served.api.dropped_watches >= 1
    assert watched.informer.get("default", "someone-elses") is None  # the server filtered it
    assert watched.changes == [("ConfigMap", "first"), ("ConfigMap", "second")]


async def test_an_expired_watch_lists_again_and_hears_what_it_missed(watched: Watched) -> None:
    await watched.informer.ready()
    create(watched.served, "kept")
    await eventually("kept", lambda: watched.informer.get("default", "kept"))
    # The watch drops; while it is down (this test's blocking calls hold the informer's event
    # loop) "kept" goes and the server forgets the history the watch would resume from.
    watched.served.drop_watches()
    call(watched.served, "DELETE", f"{CONFIGMAPS}/kept")
    watched.served.api.compact()
    await eventually("a second list", lambda: watched.lists() == 2)
    await eventually("kept gone", lambda: watched.informer.get("default", "kept") is None)
    assert watched.changes[-1] == ("ConfigMap", "kept")  # the deletion was heard


async def test_a_kind_the_cluster_lacks_is_empty_until_served() -> None:
    with FaultyServedKubeApi() as served:
        watched = Watched(served, "PodMonitor")
        task = asyncio.create_task(watched.informer.run())
        assert await watched.informer.ready() is State.ABSENT
        served.api.serve_kind(Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"))
        await eventually("listed", lambda: watched.informer.state is State.LISTED)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watched.kube.close()


async def test_a_kind_the_operator_may_not_list_says_why_until_granted() -> None:
    with FaultyServedKubeApi() as served:
        token = served.api.service_account_token("carpool", "carpool")
        watched = Watched(served, "HorizontalPodAutoscaler", token=token)
        task = asyncio.create_task(watched.informer.run())
        assert await watched.informer.ready() is State.FORBIDDEN
        assert isinstance(watched.informer.refusal, ApiError)
        assert 'cannot list resource "horizontalpodautoscalers"' in watched.informer.refusal.message

        rbac = "/apis/rbac.authorization.k8s.io/v1"
        rule = {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"]}
        role = {"metadata": {"name": "hpa"}, "rules": [{**rule, "verbs": ["list", "watch"]}]}
        bound = binding("Role", "hpa", "carpool", "carpool")
        call(served, "POST", f"{rbac}/namespaces/default/roles", role)
        call(served, "POST", f"{rbac}/namespaces/default/rolebindings", bound)
        await eventually("listed", lambda: watched.informer.state is State.LISTED)
        assert watched.informer.refusal is None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watched.kube.close()


async def test_watches_that_end_at_once_are_opened_again_ever_more_slowly() -> None:
    """A watch that ends at once with nothing said (a proxy cutting it, an API server going
    away) is a failure, not a watch that did its time: opened again after a growing pause,
    not as fast as the server can answer."""
    with FaultyServedKubeApi() as served:
        served.api.watch_cut_s = 0.0
        watched = Watched(served, "ConfigMap")
        task = asyncio.create_task(watched.informer.run())
        await watched.informer.ready()
        await asyncio.sleep(3.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watched.kube.close()
        path = watched.informer._path
        watches = [
            record
            for record in list(served.api.records)
            if record.path == path and "watch=true" in record.query
        ]
    # Pauses of 0.1, 0.5, 1 and 2 s (informer.BACKOFF_S) fit 5 watches in 3 s.
    assert len(watches) <= 6, len(watches)


async def test_a_kind_the_operator_may_list_but_not_watch_says_so_and_lists_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RBAC written when the operator only listed (`list` without `watch`): the cache is
    current only as often as it lists again, which an admin must hear of once."""
    with FaultyServedKubeApi() as served:
        token = served.api.service_account_token("carpool", "carpool")
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}
        call(
            served,
            "POST",
            f"{rbac}/namespaces/default/roles",
            {"metadata": {"name": "cm"}, "rules": [rule]},
        )
        call(
            served,
            "POST",
            f"{rbac}/namespaces/default/rolebindings",
            binding("Role", "cm", "carpool", "carpool"),
        )
        watched = Watched(served, "ConfigMap", token=token)
        with caplog.at_level(logging.INFO, logger="carpool_operator.informer"):
            task = asyncio.create_task(watched.informer.run())
            assert await watched.informer.ready() is State.LISTED
            create(served, "later")
            await eventually("later", lambda: watched.informer.get("default", "later"))
            await eventually("a third list", lambda: watched.lists() >= 3)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await watched.kube.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert 'cannot watch resource "configmaps"' in warnings[0].getMessage()


def test_an_earlier_version_never_replaces_a_later_one() -> None:
    informer = Informer(
        KubeClient(), "Deployment", "default", MANAGED, lambda _: True, lambda *_: None, 1.0
    )

    def deployment(version: str, uid: str = "u1") -> Manifest:
        metadata = {"name": "m", "namespace": "default", "uid": uid, "resourceVersion": version}
        return {"kind": "Deployment", "metadata": metadata}

    assert informer.put(deployment("12"))  # what an apply answered
    assert not informer.put(deployment("9"))  # a watch event from before it, late
    assert informer.get("default", "m") == deployment("12")
    assert informer.put(deployment("13"))  # the watch catches up
    assert informer.put(deployment("5", uid="u2"))  # deleted and made again: a new object
    assert informer.put(deployment("opaque", uid="u2"))  # not an integer: the later arrival
