"""The dashboard's Generation row against a live stack that generates text: a sidecar and a
model server batching the tiny GPT-2 token by token, streamed requests from a few clients,
scraped by a real Prometheus."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from dashboard.panels import GENERATION, load, panels, substitute
from library.tiny_lm import WORDS, build_tiny_lm
from support.prometheus import Prometheus, run_prometheus
from support.sidecar import run_pair

from carpool.processes import free_port

MODEL = "gen"
CLIENTS = 4
LOAD_S = 6.0
SCRAPE_INTERVAL_S = 1.0
RATE_INTERVAL = "10s"
ROW = [panel for panel in panels(load()) if panel.title in GENERATION]


async def _streams(url: str, seconds: float) -> int:
    """Closed-loop clients streaming answers of 8 to 64 tokens until `seconds` pass."""
    deadline = time.monotonic() + seconds
    answered = 0

    async def client(http: aiohttp.ClientSession, offset: int) -> None:
        nonlocal answered
        while time.monotonic() < deadline:
            prompt = " ".join(WORDS[(offset + answered) % len(WORDS) :][:12])
            body = {"text_input": prompt or "the", "parameters": {"max_tokens": 8 + 8 * offset}}
            async with http.post(url, data=orjson.dumps(body)) as reply:
                assert reply.status == 200, await reply.read()
                await reply.read()
            answered += 1

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(client(http, n) for n in range(CLIENTS)))
    return answered


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, float, float]]:
    tmp_path = tmp_path_factory.mktemp("generation")
    metrics_port = free_port()
    model = build_tiny_lm(tmp_path / "lm")
    model_args = ["--model-path", str(model), "--device", "cpu", "--warmup-sizes", "1"]
    model_args += ["--handler-options", "batching=continuous", "--metrics-port", str(metrics_port)]
    with run_pair(tmp_path, "text-generation", model_args=model_args, model=MODEL) as pair:
        jobs = {
            "sidecar": [pair.sidecar.url.removeprefix("http://")],
            "model-server": [f"127.0.0.1:{metrics_port}"],
        }
        with run_prometheus(tmp_path, jobs, scrape_interval_s=SCRAPE_INTERVAL_S) as prometheus:
            prometheus.wait_for_targets(timeout_s=30)
            start = time.time()
            url = pair.sidecar.url + f"/v2/models/{MODEL}/generate_stream"
            assert asyncio.run(_streams(url, LOAD_S)) > 0
            time.sleep(2 * SCRAPE_INTERVAL_S)
            yield prometheus, start, time.time()


def _values(prometheus: Prometheus, expr: str, start: float, end: float) -> list[float]:
    series = prometheus.query_range(expr, start, end, step_s=1)
    return [float(value) for one in series for _, value in one["values"]]


@pytest.mark.slow
def test_every_generation_panel_shows_the_live_stack(
    live: tuple[Prometheus, float, float],
) -> None:
    prometheus, start, end = live
    assert len(ROW) == len(GENERATION)
    empty, unfiltered = [], []
    for panel in ROW:
        for query in panel.queries:
            expr = substitute(query.expr, rate=RATE_INTERVAL)
            if not any(math.isfinite(v) for v in _values(prometheus, expr, start, end)):
                empty.append(f"{panel.title} [{query.legend}]")
            for other in ({"model": "other"}, {"namespace": "other"}):
                expr = substitute(query.expr, rate=RATE_INTERVAL, **other)
                if _values(prometheus, expr, start, end):
                    unfiltered.append(f"{panel.title} [{query.legend}] {other}")
    # The waiting gauges may stay at 0 under this light load: 0 is data, not emptiness.
    assert not empty, empty
    assert not unfiltered, unfiltered


@pytest.mark.slow
def test_generation_quantiles_draw_the_model(live: tuple[Prometheus, float, float]) -> None:
    prometheus, start, end = live
    for panel in ROW:
        for query in panel.queries:
            if "histogram_quantile" not in query.expr:
                continue
            expr = substitute(query.expr, rate=RATE_INTERVAL)
            series = prometheus.query_range(expr, start, end, step_s=1)
            assert [one["metric"]["model"] for one in series] == [MODEL], panel.title
