"""Clients for the reliability scenarios: one toy request, its outcome, and what to count.

Every request is checked the way a caller would check it: a 200 must carry 2 * input + 1 for
its own rows; anything else is recorded with its status and the time it took.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from support.sidecar import Sidecar, metric

# The toy model's input width: each item is one FP32 row of 4.
WIDTH = 4


@dataclass(frozen=True)
class Outcome:
    """What one caller saw: a status (None: no HTTP answer at all) and how long it took."""

    status: int | None
    seconds: float
    started: float  # time.monotonic() when the request was sent
    correct: bool = False  # a 200 with exactly the expected outputs
    error: str = ""
    retry_after: str | None = None


def rows_for(rng: random.Random, count: int) -> list[list[float]]:
    # Small integers: exact in FP32, so 2 * x + 1 compares exactly.
    return [[float(rng.randint(-1000, 1000)) for _ in range(WIDTH)] for _ in range(count)]


def body_for(rows: Sequence[Sequence[float]]) -> dict[str, Any]:
    data = [value for row in rows for value in row]
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [len(rows), WIDTH], "data": data}]
    }


def expected(rows: Sequence[Sequence[float]]) -> list[float]:
    return [2 * value + 1 for row in rows for value in row]


def binary_body_for(rows: Sequence[Sequence[float]]) -> tuple[bytes, dict[str, str]]:
    """The binary tensor data form: a JSON header, then raw little-endian FP32 (NaN allowed)."""
    data = np.asarray(rows, dtype="<f4").tobytes()
    header = {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [len(rows), WIDTH],
                "parameters": {"binary_data_size": len(data)},
            }
        ]
    }
    head = orjson.dumps(header)
    return head + data, {"Inference-Header-Content-Length": str(len(head))}


async def call(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    rows: Sequence[Sequence[float]],
    timeout_s: float,
    *,
    binary: bool = False,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """One inference request; never raises, whatever happens to it."""
    url = f"{sidecar.url}/v2/models/{sidecar.model}/infer"
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    body, codec_headers = binary_body_for(rows) if binary else (orjson.dumps(body_for(rows)), {})
    headers = {**codec_headers, **(headers or {})}
    headers["Content-Type"] = "application/octet-stream" if binary else "application/json"
    try:
        async with http.post(url, data=body, headers=headers, timeout=timeout) as reply:
            document = await reply.json(content_type=None)
            correct = reply.status == 200 and _outputs_match(document, rows)
            return Outcome(
                reply.status,
                time.monotonic() - started,
                started,
                correct,
                "" if reply.status == 200 else str(document.get("error", ""))[:200],
                reply.headers.get("Retry-After"),
            )
    except TimeoutError:
        return Outcome(None, time.monotonic() - started, started, error="client timeout")
    except aiohttp.ClientError as error:
        return Outcome(None, time.monotonic() - started, started, error=type(error).__name__)


def _outputs_match(document: Any, rows: Sequence[Sequence[float]]) -> bool:
    try:
        (output,) = document["outputs"]
        return bool(output["shape"] == [len(rows), WIDTH] and output["data"] == expected(rows))
    except (KeyError, TypeError, ValueError):
        return False


def statuses(outcomes: Sequence[Outcome]) -> Counter[int | None]:
    return Counter(outcome.status for outcome in outcomes)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def latency_summary(outcomes: Sequence[Outcome]) -> str:
    seconds = [outcome.seconds for outcome in outcomes]
    return (
        f"p50 {1000 * percentile(seconds, 0.5):.0f} ms, p99 {1000 * percentile(seconds, 0.99):.0f} "
        f"ms, max {1000 * max(seconds, default=0):.0f} ms"
    )


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status (VmRSS is in KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def gauge(sidecar: Sidecar, name: str) -> float:
    """A sidecar metric, read without blocking the event loop."""
    return await asyncio.to_thread(metric, sidecar, name)


async def until_idle(sidecar: Sidecar, timeout_s: float) -> tuple[float, float]:
    """Wait until the queue and in-flight gauges are both zero; returns their last values."""
    deadline = time.monotonic() + timeout_s
    while True:
        queued = await gauge(sidecar, "carpool_queue_items")
        inflight = await gauge(sidecar, "carpool_inflight_batches")
        if (queued == 0 and inflight == 0) or time.monotonic() > deadline:
            return queued, inflight
        await asyncio.sleep(0.05)


async def post_json(
    http: aiohttp.ClientSession,
    url: str,
    body: bytes,
    timeout_s: float,
    correct: Callable[[Any], bool],
) -> Outcome:
    """One JSON request to any route; `correct` judges a 200's document. Never raises."""
    started = time.monotonic()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.post(url, data=body, timeout=timeout) as reply:
            document = await reply.json(content_type=None)
            ok = reply.status == 200 and correct(document)
            error = "" if reply.status == 200 else str(document.get("error", ""))
            return Outcome(reply.status, time.monotonic() - started, started, ok, error)
    except (TimeoutError, aiohttp.ClientError) as failure:
        return Outcome(None, time.monotonic() - started, started, error=repr(failure))


def groups_summary(groups: Sequence[tuple[str, Sequence[Outcome]]]) -> str:
    """Statuses and latencies of each named group of outcomes."""
    return "; ".join(
        f"{name}: {dict(statuses(outcomes))} {latency_summary(outcomes)}"
        for name, outcomes in groups
    )


# A bound on each neighbour's calls; the scenario's own rounds end it first.
NEIGHBOUR_CALLS = 100_000


@asynccontextmanager
async def neighbours(
    count: int, call: Callable[[], Awaitable[Outcome]], outcomes: list[Outcome]
) -> AsyncIterator[None]:
    """`count` callers, each calling `call` again and again while the block runs (at most
    NEIGHBOUR_CALLS times), their outcomes in `outcomes`; the block starts once they flow."""
    stop = asyncio.Event()

    async def neighbour() -> None:
        for _ in range(NEIGHBOUR_CALLS):
            if stop.is_set():
                return
            outcomes.append(await call())

    tasks = [asyncio.create_task(neighbour()) for _ in range(count)]
    try:
        await asyncio.sleep(0.5)
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def wrong_answers(name: str, outcomes: Sequence[Outcome]) -> list[str]:
    """The promise that each of `outcomes` is a correct 200, as broken (if it was)."""
    if set(statuses(outcomes)) == {200} and all(outcome.correct for outcome in outcomes):
        return []
    return [f"{name} got {dict(statuses(outcomes))}"]


def slow_refusals(
    name: str, outcomes: Sequence[Outcome], status: int, words: str, within_s: float
) -> list[str]:
    """The promise that each of `outcomes` is `status` naming `words` within `within_s`."""
    broken = []
    for outcome in outcomes:
        if outcome.status != status or words not in outcome.error:
            broken.append(f"{name}: {outcome.status} {outcome.error[:200]!r}")
        elif outcome.seconds >= within_s:
            broken.append(f"{name} refused only after {outcome.seconds:.2f} s")
    return broken


async def good_client(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    seed: int,
    done: asyncio.Event,
    outcomes: list[Outcome],
) -> None:
    """A neighbour of whatever a scenario tries: two toy rows every 20 ms until `done`."""
    rng = random.Random(seed)
    while not done.is_set():
        outcomes.append(await call(http, sidecar, rows_for(rng, 2), 10))
        await asyncio.sleep(0.02)


class RssPeak:
    """A process's RSS as the block starts (`before`) and its highest while the block runs
    (`peak`), which a thread samples every 5 ms."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.before = self.peak = rss_bytes(pid)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="rss-peak")

    def __enter__(self) -> RssPeak:
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._sampler.join()

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss_bytes(self._pid))
