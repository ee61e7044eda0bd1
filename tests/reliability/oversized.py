"""One request far beyond maxQueueItems, sent in the binary form, while a good one waits.

One implementation for the quick test (`test_oversized.py`) and the soak
(`bench/soak.py oversized`). The big request's JSON header declares its item count, so the
sidecar can refuse it (413) without cutting it into per-item objects; a small request sent
meanwhile must still get its 200 well within its deadline. A thread samples the sidecar's
RSS throughout.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from reliability.traffic import WIDTH, Outcome, call, rows_for, rss_bytes
from support.sidecar import Sidecar, run_pair


@dataclass(frozen=True)
class Plan:
    items: int = 4_000_000  # 16 bytes each: 64,000,000 bytes, under the 64 MiB body limit
    rounds: int = 1
    good_timeout_ms: int = 2_000


@dataclass
class Report:
    body_bytes: int = 0
    big: list[tuple[int, float, float]] = field(default_factory=list)  # status, sent->answer, total
    good: list[Outcome] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


def big_body(items: int) -> tuple[bytes, int]:
    """The binary request and its JSON header length; the data is zeros."""
    data_bytes = items * WIDTH * 4
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [items, WIDTH],
                    "parameters": {"binary_data_size": data_bytes},
                }
            ]
        }
    )
    return header + bytes(data_bytes), len(header)


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    body, header_length = big_body(plan.items)
    report.body_bytes = len(body)
    timeout = str(plan.good_timeout_ms)
    with run_pair(folder, "toy", "--timeout-ms", "30000") as pair:
        sidecar = pair.sidecar
        pid = sidecar.process.pid
        async with aiohttp.ClientSession() as http:
            await call(http, sidecar, rows_for(random.Random(0), 2), 10)  # warm
            report.rss_before = report.rss_peak = rss_bytes(pid)
            sampling = threading.Event()
            sampler = threading.Thread(target=_sample, args=(pid, report, sampling))
            sampler.start()
            try:
                for index in range(plan.rounds):
                    big = asyncio.create_task(_send_big(sidecar, body, header_length))
                    await asyncio.sleep(0.01)
                    good = await call(
                        http,
                        sidecar,
                        rows_for(random.Random(index), 2),
                        plan.good_timeout_ms / 1000 + 10,
                        headers={"X-Carpool-Timeout-Ms": timeout},
                    )
                    report.big.append(await big)
                    report.good.append(good)
            finally:
                sampling.set()
                sampler.join()
    return report


def _sample(pid: int, report: Report, done: threading.Event) -> None:
    while not done.wait(0.005):
        report.rss_peak = max(report.rss_peak, rss_bytes(pid))


async def _send_big(sidecar: Sidecar, body: bytes, header_length: int) -> tuple[int, float, float]:
    """(status, seconds from the last byte sent to the answer, seconds in all)."""
    host, port = sidecar.url.removeprefix("http://").split(":")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = (
            f"POST /v2/models/{sidecar.model}/infer HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        sent = time.monotonic()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        answered = time.monotonic()
        return int(status_line.split()[1]), answered - sent, answered - started
    finally:
        writer.close()


def summary(report: Report) -> str:
    big = [
        (status, round(1000 * after, 1), round(1000 * total)) for status, after, total in report.big
    ]
    good = [(o.status, round(1000 * o.seconds)) for o in report.good]
    return (
        f"{report.body_bytes} byte request: (status, ms after last byte, ms in all) {big}; "
        f"good request meanwhile (status, ms) {good}; sidecar RSS {report.rss_before >> 20} MiB, "
        f"peak {report.rss_peak >> 20} MiB (+{(report.rss_peak - report.rss_before) >> 20} MiB)"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    for status, after, _ in report.big:
        if status != 413:
            broken.append(f"the oversized request got {status}, not 413")
        if after > 0.1:
            broken.append(f"413 came {1000 * after:.0f} ms after the last byte, not under 100")
    for outcome in report.good:
        if outcome.status != 200 or not outcome.correct:
            broken.append(f"the good request meanwhile got {outcome.status} {outcome.error}")
        elif outcome.seconds > plan.good_timeout_ms / 1000:
            broken.append(f"the good request took {outcome.seconds:.2f}s")
    grown = report.rss_peak - report.rss_before
    if grown > 2 * report.body_bytes:
        broken.append(
            f"sidecar RSS grew {grown >> 20} MiB for a {report.body_bytes >> 20} MiB body"
        )
    return broken
