"""Huge prompts and settings past their bounds to text-generation, while neighbours generate.

One implementation for the quick test (`test_long_prompt.py`) and the soak (`bench/soak.py
long_prompt`). The model is a tiny GPT-2 (context 256 tokens, `tests/library/tiny_lm.py`)
behind a real sidecar and model server. Neighbours keep generating a few tokens for short
prompts through the generate route; meanwhile one caller sends, in turn, a 16 MB prompt, a
60 MB one, and requests with a temperature of 1e-38, 20 stop strings and max_new_tokens
3000000000.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from library.tiny_lm import build_tiny_lm
from reliability.traffic import Outcome as Answer
from reliability.traffic import latency_summary, rss_bytes, statuses
from support.sidecar import run_pair

MODEL = "gen"
PROMPT = "the cat sat on the mat"


@dataclass(frozen=True)
class Plan:
    neighbours: int = 8
    rounds: int = 2  # each: a 16 MB and a 60 MB prompt, and the settings past their bounds
    timeout_ms: int = 5_000  # the sidecar's deadline: a blocked worker shows as 504s
    refused_within_s: float = 3.0  # the body's upload and the sidecar's parse included
    max_model_rss_growth_mib: float = 100.0
    max_requests_per_neighbour: int = 100_000  # a bound; the rounds end the run first


@dataclass
class Report:
    neighbours: list[Answer] = field(default_factory=list)
    huge: list[Answer] = field(default_factory=list)  # 16 MB and 60 MB prompts
    settings: list[Answer] = field(default_factory=list)  # stop strings, max_new_tokens
    tiny_temperature: list[Answer] = field(default_factory=list)
    model_rss_growth_mib: float = 0.0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    model = build_tiny_lm(folder / "tiny-lm")
    model_args = ("--model-path", str(model), "--device", "cpu", "--warmup-sizes", "1,4")
    sidecar_args = ("--timeout-ms", str(plan.timeout_ms), "--max-body-bytes", str(64 << 20))
    with run_pair(
        folder, "text-generation", *sidecar_args, model_args=model_args, model=MODEL
    ) as pair:
        url = f"{pair.sidecar.url}/v2/models/{MODEL}/generate"
        rss_before = rss_bytes(pair.model_server.process.pid)
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            neighbours = [
                asyncio.create_task(_neighbour(http, url, plan, stop, report.neighbours))
                for _ in range(plan.neighbours)
            ]
            try:
                await asyncio.sleep(0.5)  # the neighbours' batches are flowing
                for _ in range(plan.rounds):
                    for size in (16_000_000, 60_000_000):
                        report.huge.append(await _generate(http, url, "x" * size, {}, plan))
                    for past in ({"stop": ["sun"] * 20}, {"max_new_tokens": 3_000_000_000}):
                        report.settings.append(await _generate(http, url, PROMPT, past, plan))
                    tiny = {"temperature": 1e-38, "max_new_tokens": 4}
                    report.tiny_temperature.append(await _generate(http, url, PROMPT, tiny, plan))
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
        answers.append(await _generate(http, url, PROMPT, {"max_new_tokens": 4}, plan))


async def _generate(
    http: aiohttp.ClientSession, url: str, prompt: str, parameters: dict[str, Any], plan: Plan
) -> Answer:
    body = orjson.dumps({"text_input": prompt, "parameters": parameters})
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=plan.timeout_ms / 1000 + 30)
    try:
        async with http.post(url, data=body, timeout=timeout) as reply:
            document = await reply.json(content_type=None)
            correct = reply.status == 200 and isinstance(document.get("text_output"), str)
            error = "" if reply.status == 200 else str(document.get("error", ""))
            return Answer(reply.status, time.monotonic() - started, started, correct, error)
    except (TimeoutError, aiohttp.ClientError) as failure:
        return Answer(None, time.monotonic() - started, started, error=repr(failure))


def summary(report: Report) -> str:
    parts = [
        f"{name}: {dict(statuses(answers))} {latency_summary(answers)}"
        for name, answers in (
            ("neighbours", report.neighbours),
            ("16 MB and 60 MB prompts", report.huge),
            ("20 stop strings, max_new_tokens 3e9", report.settings),
            ("temperature 1e-38", report.tiny_temperature),
        )
    ]
    return "; ".join(parts) + f"; model server RSS +{report.model_rss_growth_mib:.0f} MiB"


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if set(statuses(report.neighbours)) != {200} or not all(a.correct for a in report.neighbours):
        broken.append(f"neighbours got {dict(statuses(report.neighbours))}")
    for answer in report.huge:
        if answer.status != 400 or "max_element_bytes" not in answer.error:
            broken.append(f"a huge prompt: {answer.status} {answer.error[:200]!r}")
        elif answer.seconds >= plan.refused_within_s:
            broken.append(f"a huge prompt refused only after {answer.seconds:.2f} s")
    for answer in report.settings:
        if answer.status != 400 or answer.seconds >= plan.refused_within_s:
            broken.append(f"a setting past its bound: {answer.status} {answer.error[:200]!r}")
    if not all(a.status == 200 and a.correct for a in report.tiny_temperature):
        broken.append(
            f"temperature 1e-38: {[(a.status, a.error) for a in report.tiny_temperature]}"
        )
    if report.model_rss_growth_mib > plan.max_model_rss_growth_mib:
        broken.append(f"model server RSS grew by {report.model_rss_growth_mib:.0f} MiB")
    return broken
