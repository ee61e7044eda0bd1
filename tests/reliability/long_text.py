"""Huge texts to text-embedding while neighbours embed sentences: each costs what 256 tokens do.

One implementation for the quick test (`test_long_text.py`) and the soak (`bench/soak.py
long_text`). Neighbours keep sending one sentence each through the sidecar; meanwhile one
caller sends, in turn, a 16 MB text (over the handler's byte limit: refused before it is
queued), a text at the limit (1 MiB: only its first characters are tokenized) and a text of
about 300 tokens (the reference cost).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from reliability.traffic import Outcome as Answer
from reliability.traffic import latency_summary, percentile, rss_bytes, statuses
from support.sidecar import run_pair

from carpool_model_server.handler_text_embedding import MAX_TEXT_BYTES

MODEL = "text-embedding"
SENTENCE = "A cat sits on the mat while the kettle boils."
# About 300 tokens: past the 256-token truncation, so it costs the most a text may.
REFERENCE_TEXT = "carpool batches requests for the model. " * 40


@dataclass(frozen=True)
class Plan:
    neighbours: int = 12
    rounds: int = 3  # each: one huge, one at the limit, one reference text
    huge_bytes: int = 16 * 1024 * 1024
    timeout_ms: int = 5_000  # the sidecar's deadline: a blocked worker shows as 504s
    refused_within_s: float = 1.0
    slower_than_reference: float = 3.0  # the limit text's latency, at most this times
    max_model_rss_growth_mib: float = 100.0
    max_requests_per_neighbour: int = 100_000  # a bound; the rounds end the run first


@dataclass
class Report:
    neighbours: list[Answer] = field(default_factory=list)
    huge: list[Answer] = field(default_factory=list)
    at_limit: list[Answer] = field(default_factory=list)
    reference: list[Answer] = field(default_factory=list)
    model_rss_growth_mib: float = 0.0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    sidecar_args = ("--timeout-ms", str(plan.timeout_ms))
    model_args = ("--device", "cpu", "--warmup-sizes", "1,2,4,8,16")
    with run_pair(
        folder, "text-embedding", *sidecar_args, model_args=model_args, model=MODEL
    ) as pair:
        url = f"{pair.sidecar.url}/v2/models/{MODEL}/infer"
        rss_before = rss_bytes(pair.model_server.process.pid)
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            neighbours = [
                asyncio.create_task(_neighbour(http, url, plan, stop, report.neighbours))
                for _ in range(plan.neighbours)
            ]
            try:
                await asyncio.sleep(0.5)  # the neighbours' batches are flowing
                limit_text = "carpool " * (MAX_TEXT_BYTES // 8)
                for _ in range(plan.rounds):
                    report.huge.append(await _embed(http, url, "x" * plan.huge_bytes, plan))
                    report.at_limit.append(await _embed(http, url, limit_text, plan))
                    report.reference.append(await _embed(http, url, REFERENCE_TEXT, plan))
            finally:
                stop.set()
                await asyncio.gather(*neighbours)
        report.model_rss_growth_mib = (
            rss_bytes(pair.model_server.process.pid) - rss_before
        ) / 2**20
    return report


async def _neighbour(
    http: aiohttp.ClientSession, url: str, plan: Plan, stop: asyncio.Event, answers: list[Answer]
) -> None:
    for _ in range(plan.max_requests_per_neighbour):
        if stop.is_set():
            return
        answers.append(await _embed(http, url, SENTENCE, plan))


async def _embed(http: aiohttp.ClientSession, url: str, text: str, plan: Plan) -> Answer:
    body = orjson.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    )
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=plan.timeout_ms / 1000 + 10)
    try:
        async with http.post(url, data=body, timeout=timeout) as reply:
            document = await reply.json(content_type=None)
            correct = reply.status == 200 and document["outputs"][0]["shape"] == [1, 384]
            error = "" if reply.status == 200 else str(document.get("error", ""))
            return Answer(reply.status, time.monotonic() - started, started, correct, error)
    except (TimeoutError, aiohttp.ClientError) as failure:
        return Answer(None, time.monotonic() - started, started, error=repr(failure))


def summary(report: Report) -> str:
    parts = [
        f"{name}: {dict(statuses(answers))} {latency_summary(answers)}"
        for name, answers in (
            ("neighbours", report.neighbours),
            ("16 MB text", report.huge),
            ("1 MiB text", report.at_limit),
            ("300-token text", report.reference),
        )
    ]
    return "; ".join(parts) + f"; model server RSS +{report.model_rss_growth_mib:.0f} MiB"


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if set(statuses(report.neighbours)) != {200} or not all(a.correct for a in report.neighbours):
        broken.append(f"neighbours got {dict(statuses(report.neighbours))}")
    for answer in report.huge:
        if answer.status != 400 or "max_element_bytes" not in answer.error:
            broken.append(f"16 MB text: {answer.status} {answer.error[:200]!r}")
        elif answer.seconds >= plan.refused_within_s:
            broken.append(f"16 MB text refused only after {answer.seconds:.2f} s")
    if not all(a.status == 200 and a.correct for a in report.at_limit + report.reference):
        broken.append(
            f"texts within the limit: {dict(statuses(report.at_limit + report.reference))}"
        )
    reference_s = percentile([a.seconds for a in report.reference], 0.5)
    slowest_s = max((a.seconds for a in report.at_limit), default=0.0)
    if slowest_s > plan.slower_than_reference * reference_s:
        broken.append(f"a 1 MiB text took {slowest_s:.2f} s, a 300-token text {reference_s:.2f} s")
    if report.model_rss_growth_mib > plan.max_model_rss_growth_mib:
        broken.append(f"model server RSS grew by {report.model_rss_growth_mib:.0f} MiB")
    return broken
