"""`carpool serve --demo-load`: a short bounded concurrent load through a running sidecar.

Each client sends one-item requests back to back; the report shows throughput, latency and
the mean batch size the sidecar formed (from its own /metrics, so it shows batching at work).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

# Real sentences for the text-embedding demo; short and long, so length buckets matter.
SENTENCES = (
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "Kubernetes schedules pods onto nodes in a cluster.",
    "Dynamic batching groups requests that arrive close together.",
    "The weather in Lisbon is mild in the winter.",
    "She ordered a coffee and a slice of lemon cake.",
    "Model servers run a whole batch in one forward pass, which uses the hardware better.",
    "Prometheus scrapes metrics over HTTP at a fixed interval.",
    "The train to Edinburgh leaves from platform four.",
    "Latency percentiles tell more than an average does.",
    "He planted tomatoes, basil and a row of sunflowers along the fence.",
    "Sentence embeddings map text to vectors so that similar meanings lie close together.",
)


@dataclass(frozen=True, slots=True)
class DemoReport:
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_batch_size: float

    def lines(self) -> list[str]:
        return [
            f"requests:        {self.requests} ({self.errors} failed) in {self.seconds:.1f} s",
            f"throughput:      {self.requests / self.seconds:.1f} requests/s",
            f"latency:         p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms",
            f"mean batch size: {self.mean_batch_size:.2f}",
        ]


def make_inputs(metadata: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """One item's worth of every model input: a sentence for text, small numbers otherwise."""
    inputs = []
    for spec in metadata["inputs"]:
        shape = [1, *(8 if dim == -1 else dim for dim in spec["shape"][1:])]
        count = int(np.prod(shape))
        if spec["datatype"] == "BYTES":
            data: list[Any] = [SENTENCES[(index + k) % len(SENTENCES)] for k in range(count)]
        elif spec["datatype"] == "BOOL":
            data = [bool((index + k) % 2) for k in range(count)]
        else:
            data = [(index + k) % 7 for k in range(count)]
        inputs.append(
            {"name": spec["name"], "datatype": spec["datatype"], "shape": shape, "data": data}
        )
    return inputs


async def batch_totals(http: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float]:
    """(items, batches) sent so far, from the sidecar's carpool_batch_size histogram."""
    async with http.get(f"{url}/metrics") as reply:
        text = await reply.text()
    totals = {"carpool_batch_size_sum": 0.0, "carpool_batch_size_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals and sample.labels.get("model") == model:
                totals[sample.name] = sample.value
    return totals["carpool_batch_size_sum"], totals["carpool_batch_size_count"]


async def run_demo(
    url: str, model: str, clients: int, seconds: float, max_requests: int
) -> DemoReport:
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        async with http.get(f"{url}/v2/models/{model}") as reply:
            reply.raise_for_status()
            metadata = await reply.json()
        items_before, batches_before = await batch_totals(http, url, model)
        latencies: list[float] = []
        errors = 0
        numbers = itertools.count()
        started = time.monotonic()
        stop_at = started + seconds

        async def client() -> None:
            nonlocal errors
            while time.monotonic() < stop_at and (index := next(numbers)) < max_requests:
                body = {"inputs": make_inputs(metadata, index)}
                sent = time.monotonic()
                async with http.post(f"{url}/v2/models/{model}/infer", json=body) as reply:
                    await reply.read()
                    if reply.status != 200:
                        errors += 1
                latencies.append(time.monotonic() - sent)

        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
        items_after, batches_after = await batch_totals(http, url, model)
    batches = batches_after - batches_before
    p50, p99 = np.percentile(np.array(latencies) * 1000, [50, 99]) if latencies else (0.0, 0.0)
    return DemoReport(
        requests=len(latencies),
        errors=errors,
        seconds=elapsed,
        p50_ms=float(p50),
        p99_ms=float(p99),
        mean_batch_size=(items_after - items_before) / batches if batches else 0.0,
    )
