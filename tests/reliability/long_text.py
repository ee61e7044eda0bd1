"""Huge texts to text-embedding while neighbours embed sentences: each costs what 256 tokens do.

One implementation for the quick test (`test_long_text.py`) and the soak (`bench/soak.py
long_text`). Neighbours keep sending one sentence each through the sidecar; meanwhile one
caller sends, in turn, a 16 MB text (over the handler's byte limit: refused before it is
queued), a text at the limit (1 MiB: only its first characters are tokenized) and a text of
about 300 tokens (the reference cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from reliability.traffic import Outcome as Answer
from reliability.traffic import (
    groups_summary,
    neighbours,
    percentile,
    post_json,
    rss_bytes,
    slow_refusals,
    statuses,
    wrong_answers,
)
from support.sidecar import run_pair

from carpool_model_server.text_batch import MAX_TEXT_BYTES

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
        async with aiohttp.ClientSession() as http:

            def embed(text: str) -> Awaitable[Answer]:
                return _embed(http, url, text, plan)

            async with neighbours(plan.neighbours, lambda: embed(SENTENCE), report.neighbours):
                limit_text = "carpool " * (MAX_TEXT_BYTES // 8)
                for _ in range(plan.rounds):
                    report.huge.append(await embed("x" * plan.huge_bytes))
                    report.at_limit.append(await embed(limit_text))
                    report.reference.append(await embed(REFERENCE_TEXT))
        report.model_rss_growth_mib = (
            rss_bytes(pair.model_server.process.pid) - rss_before
        ) / 2**20
    return report


async def _embed(http: aiohttp.ClientSession, url: str, text: str, plan: Plan) -> Answer:
    body = orjson.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    )
    return await post_json(http, url, body, plan.timeout_ms / 1000 + 10, _embedded)


def _embedded(document: Any) -> bool:
    return bool(document["outputs"][0]["shape"] == [1, 384])


def summary(report: Report) -> str:
    groups = [
        ("neighbours", report.neighbours),
        ("16 MB text", report.huge),
        ("1 MiB text", report.at_limit),
        ("300-token text", report.reference),
    ]
    return groups_summary(groups) + f"; model server RSS +{report.model_rss_growth_mib:.0f} MiB"


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = wrong_answers("neighbours", report.neighbours)
    broken += slow_refusals(
        "16 MB text", report.huge, 400, "max_element_bytes", plan.refused_within_s
    )
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
