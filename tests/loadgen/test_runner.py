"""The runner over real HTTP against a minimal in-process server without batching.

This is what `carpool bench` sees from a baseline server: answers, some errors and no
/metrics. The run against a real sidecar is in test_bench_sidecar.py.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from support.http_app import serving

from carpool.loadgen import runner, workload


@pytest.fixture
async def flaky_server() -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    """Answers OIP infer calls, with 503 for every fifth; records the bodies it got."""
    bodies: list[dict[str, object]] = []

    async def infer(request: web.Request) -> web.Response:
        bodies.append(orjson.loads(await request.read()))
        if len(bodies) % 5 == 0:
            return web.json_response({"error": "busy"}, status=503)
        return web.json_response({"outputs": []})

    app = web.Application()
    app.router.add_post("/v2/models/{name}/infer", infer)
    async with serving(app) as url:
        yield url, bodies


async def test_counts_statuses_and_skips_batching_without_metrics(
    flaky_server: tuple[str, list[dict[str, object]]],
) -> None:
    url, bodies = flaky_server
    prepared = workload.build(workload.WorkloadSpec(batch_per_request=3, variants=4))
    settings = runner.RunSettings(
        url=url,
        mode="concurrency",
        levels=(4,),
        duration=None,
        requests=50,
        metrics_url=url + "/metrics",
        warmup_seconds=0,
        progress=False,
    )
    [cell] = await runner.run(settings, prepared)
    assert cell.requests == 50 == len(bodies)
    assert cell.ok == 40
    assert cell.errors == {"503": 10}
    assert cell.items_per_second == pytest.approx(cell.throughput_rps * 3)
    assert cell.latency.count == 40
    assert cell.batching is None
    first = bodies[0]["inputs"]
    assert isinstance(first, list)
    assert first[0]["shape"] == [3, 4]


async def test_a_server_that_is_not_there_stops_the_run_before_any_load() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The port is free again: nothing listens there.
    settings = runner.RunSettings(
        url=f"http://127.0.0.1:{port}",
        mode="rate",
        levels=(200,),
        duration=None,
        requests=20,
        warmup_seconds=0,
        progress=False,
    )
    with pytest.raises(runner.ServerUnreachable, match=f"no answer from http://127.0.0.1:{port}"):
        await runner.run(settings, workload.build(workload.WorkloadSpec(variants=1)))
