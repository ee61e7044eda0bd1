"""Protocol edges a KServe or Triton client meets: liveness at `/`, text shaped [n], and the
deadline message for a deadline that passes before the request is queued.

One implementation for the quick test (`test_protocol_edges.py`) and the soak
(`bench/soak.py protocol_edges`). Each round sends every case to a toy and a text (BYTES)
model behind their sidecars and records what the caller saw and how long it took.
(Exact UINT64 and INT64 from JSON are checked on the codec, `tests/sidecar/test_codec.py`:
no served model here takes them.)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from support.sidecar import Sidecar, run_pair

SIDECAR_TESTS = Path(__file__).resolve().parents[1] / "sidecar"


@dataclass(frozen=True)
class Plan:
    rounds: int = 3


@dataclass(frozen=True)
class Seen:
    case: str
    status: int
    body: Any
    seconds: float


@dataclass
class Report:
    seen: list[Seen] = field(default_factory=list)


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SIDECAR_TESTS)}
    (folder / "toy").mkdir()
    (folder / "text").mkdir()
    with (
        run_pair(folder / "toy", "toy") as toy,
        run_pair(folder / "text", "shout_handler:ShoutHandler", env=env, model="shout") as text,
    ):
        async with aiohttp.ClientSession() as http:
            for _ in range(plan.rounds):
                for case, sidecar, method, path, body, headers in _cases(toy.sidecar, text.sidecar):
                    started = time.monotonic()
                    async with http.request(
                        method, sidecar.url + path, json=body, headers=headers
                    ) as reply:
                        document = await reply.json(content_type=None)
                        seconds = time.monotonic() - started
                        report.seen.append(Seen(case, reply.status, document, seconds))
    return report


def _cases(toy: Sidecar, text: Sidecar) -> list[tuple[str, Sidecar, str, str, Any, Any]]:
    words = ["carpool", "edge", "n"]
    v2_text = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": words}]}
    toy_body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
    return [
        ("v1 liveness", toy, "GET", "/", None, None),
        ("text [n], v2", text, "POST", "/v2/models/shout/infer", v2_text, None),
        ("text [n], v1", text, "POST", "/v1/models/shout:predict", {"instances": words}, None),
        (
            "deadline over before queueing",
            toy,
            "POST",
            "/v2/models/toy/infer",
            toy_body,
            {"X-Carpool-Timeout-Ms": "0.001"},
        ),
    ]


def summary(report: Report) -> str:
    cases: dict[str, list[Seen]] = {}
    for seen in report.seen:
        cases.setdefault(seen.case, []).append(seen)
    return "; ".join(
        f"{case}: {sorted({s.status for s in seen})} in at most "
        f"{1000 * max(s.seconds for s in seen):.0f} ms"
        for case, seen in cases.items()
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    shouted = ["CARPOOL", "EDGE", "N"]
    for seen in report.seen:
        if seen.seconds > 1.0:
            broken.append(f"{seen.case}: answered after {seen.seconds:.2f}s")
        if seen.case == "v1 liveness" and (seen.status, seen.body) != (200, {"status": "alive"}):
            broken.append(f"{seen.case}: {seen.status} {seen.body}")
        elif seen.case == "text [n], v2":
            outputs = seen.body.get("outputs") if seen.status == 200 else None
            if not outputs or outputs[0]["data"] != shouted or outputs[0]["shape"] != [3, 1]:
                broken.append(f"{seen.case}: {seen.status} {seen.body}")
        elif seen.case == "text [n], v1":
            if seen.status != 200 or seen.body.get("predictions") != [[word] for word in shouted]:
                broken.append(f"{seen.case}: {seen.status} {seen.body}")
        elif seen.case == "deadline over before queueing":
            message = str(seen.body.get("error", ""))
            if seen.status != 504 or "-0" in message or "deadline" not in message:
                broken.append(f"{seen.case}: {seen.status} {message!r}")
    if len(report.seen) != 4 * plan.rounds:
        broken.append(f"{len(report.seen)} answers for {4 * plan.rounds} requests")
    return broken
