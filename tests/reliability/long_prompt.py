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
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from library.tiny_lm import build_tiny_lm
from reliability.traffic import Outcome as Answer
from reliability.traffic import (
    groups_summary,
    neighbours,
    post_json,
    rss_bytes,
    slow_refusals,
    wrong_answers,
)
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
        async with aiohttp.ClientSession() as http:

            def generate(prompt: str, **parameters: Any) -> Awaitable[Answer]:
                return _generate(http, url, prompt, parameters, plan)

            async with neighbours(
                plan.neighbours, lambda: generate(PROMPT, max_new_tokens=4), report.neighbours
            ):
                for _ in range(plan.rounds):
                    for size in (16_000_000, 60_000_000):
                        report.huge.append(await generate("x" * size))
                    report.settings.append(await generate(PROMPT, stop=["sun"] * 20))
                    report.settings.append(await generate(PROMPT, max_new_tokens=3_000_000_000))
                    tiny = await generate(PROMPT, temperature=1e-38, max_new_tokens=4)
                    report.tiny_temperature.append(tiny)
        report.model_rss_growth_mib = (
            rss_bytes(pair.model_server.process.pid) - rss_before
        ) / 2**20
    return report


async def _generate(
    http: aiohttp.ClientSession, url: str, prompt: str, parameters: dict[str, Any], plan: Plan
) -> Answer:
    body = orjson.dumps({"text_input": prompt, "parameters": parameters})
    return await post_json(http, url, body, plan.timeout_ms / 1000 + 30, _generated)


def _generated(document: Any) -> bool:
    return isinstance(document.get("text_output"), str)


def summary(report: Report) -> str:
    groups = [
        ("neighbours", report.neighbours),
        ("16 MB and 60 MB prompts", report.huge),
        ("20 stop strings, max_new_tokens 3e9", report.settings),
        ("temperature 1e-38", report.tiny_temperature),
    ]
    return groups_summary(groups) + f"; model server RSS +{report.model_rss_growth_mib:.0f} MiB"


def broken_promises(report: Report, plan: Plan) -> list[str]:
    within_s = plan.refused_within_s
    broken = wrong_answers("neighbours", report.neighbours)
    broken += slow_refusals("a huge prompt", report.huge, 400, "max_element_bytes", within_s)
    broken += slow_refusals("a setting past its bound", report.settings, 400, "", within_s)
    broken += wrong_answers("temperature 1e-38", report.tiny_temperature)
    if report.model_rss_growth_mib > plan.max_model_rss_growth_mib:
        broken.append(f"model server RSS grew by {report.model_rss_growth_mib:.0f} MiB")
    return broken
