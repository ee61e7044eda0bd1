"""Small requests for huge answers, beside a good caller.

One implementation for the quick test (`test_outsized_answers.py`) and the soak
(`bench/soak.py outsized_answers`). Each round sends: a REST request of `rows` toy rows that
asks for its one output `copies` times; the same over gRPC; `rows` rows whose JSON answer
is over --max-answer-bytes; and over gRPC `rows` rows asking for typed contents, over the
message limit. A good client calls throughout; a thread samples the sidecar's RSS.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import orjson
from reliability.traffic import (
    WIDTH,
    Outcome,
    RssPeak,
    body_for,
    call,
    good_client,
    latency_summary,
    rows_for,
    statuses,
)
from support.sidecar import Sidecar, run_pair

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest
from carpool.contract.oip_grpc.inference_pb2_grpc import GRPCInferenceServiceStub


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    rows: int = 1000  # per request: up to 64 kB of answer as JSON
    copies: int = 5000  # of the one output, in the duplicated requests
    max_answer_bytes: int = 32_768
    seed: int = 4


@dataclass
class Report:
    asked: list[tuple[str, int | str, float, int]] = field(
        default_factory=list
    )  # what, answer, s, request bytes
    good: list[Outcome] = field(default_factory=list)
    model_items: float = 0.0  # items of the big requests the model ran
    rss_before: int = 0
    rss_peak: int = 0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


def rest_body(plan: Plan, copies: int) -> bytes:
    document: dict[str, Any] = body_for([[1.0] * WIDTH] * plan.rows)
    if copies:
        document["outputs"] = [{"name": "output"}] * copies
    return orjson.dumps(document)


def grpc_request(plan: Plan, copies: int) -> ModelInferRequest:
    request = ModelInferRequest(model_name="toy")
    request.inputs.add(name="input", datatype="FP32", shape=[plan.rows, WIDTH])
    request.raw_input_contents.append(np.ones((plan.rows, WIDTH), np.float32).tobytes())
    for _ in range(copies):
        request.outputs.add(name="output")
    if not copies:  # typed contents: up to 16 bytes an element, counted as JSON
        request.parameters["binary_data_output"].bool_param = False
    return request


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    limit = str(plan.max_answer_bytes)
    args = ("--max-answer-bytes", limit, "--grpc-max-message-bytes", str(1 << 20))
    with run_pair(folder, "toy", *args) as pair:
        sidecar = pair.sidecar
        pid = sidecar.process.pid
        async with (
            aiohttp.ClientSession() as http,
            grpc.aio.insecure_channel(sidecar.grpc) as channel,
        ):
            stub = GRPCInferenceServiceStub(channel)
            await call(http, sidecar, rows_for(random.Random(0), 2), 10)  # warm
            done = asyncio.Event()
            with RssPeak(pid) as rss:
                good = asyncio.create_task(good_client(http, sidecar, plan.seed, done, report.good))
                items_before = await _batched_items(http, sidecar)
                for _ in range(plan.rounds):
                    report.asked += await asyncio.gather(
                        _post(http, sidecar, "REST outputs repeated", rest_body(plan, plan.copies)),
                        _post(http, sidecar, "REST over the answer limit", rest_body(plan, 0)),
                        _grpc(stub, "gRPC outputs repeated", grpc_request(plan, plan.copies)),
                        _grpc(stub, "gRPC typed over the limit", grpc_request(plan, 0)),
                    )
                report.model_items = await _batched_items(http, sidecar) - items_before
                await asyncio.sleep(0.5)  # the good client goes on a while
                done.set()
                await good
            report.rss_before, report.rss_peak = rss.before, rss.peak
    return report


async def _post(
    http: aiohttp.ClientSession, sidecar: Sidecar, what: str, body: bytes
) -> tuple[str, int | str, float, int]:
    started = time.monotonic()
    url = f"{sidecar.url}/v2/models/{sidecar.model}/infer"
    async with http.post(url, data=body) as reply:
        await reply.read()
        return what, reply.status, time.monotonic() - started, len(body)


async def _grpc(
    stub: GRPCInferenceServiceStub, what: str, request: ModelInferRequest
) -> tuple[str, int | str, float, int]:
    started = time.monotonic()
    try:
        await stub.ModelInfer(request, timeout=30)
    except grpc.aio.AioRpcError as error:
        return what, error.code().name, time.monotonic() - started, request.ByteSize()
    return what, "OK", time.monotonic() - started, request.ByteSize()


async def _batched_items(http: aiohttp.ClientSession, sidecar: Sidecar) -> float:
    async with http.get(f"{sidecar.url}/metrics") as reply:
        text = await reply.text()
    for line in text.splitlines():
        if line.startswith("carpool_batch_size_sum{"):
            return float(line.split()[-1])
    return 0.0


def summary(report: Report) -> str:
    asked = sorted(
        {(what, status, f"{size / 1e6:.2f} MB") for what, status, _, size in report.asked}
    )
    slowest = max((seconds for _, _, seconds, _ in report.asked), default=0.0)
    return (
        f"{len(report.asked)} requests for outsized answers: {asked}, slowest {slowest:.3f} s; "
        f"their items run by the model: {report.model_items:.0f}; good client "
        f"{len(report.good)} calls {dict(statuses(report.good))}, {latency_summary(report.good)}; "
        f"sidecar RSS {report.rss_before >> 20} MiB, peak {report.rss_peak >> 20} MiB"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    expected = {
        "REST outputs repeated": 400,
        "REST over the answer limit": 413,
        "gRPC outputs repeated": "INVALID_ARGUMENT",
        "gRPC typed over the limit": "RESOURCE_EXHAUSTED",
    }
    for what, status, seconds, _ in report.asked:
        if status != expected[what]:
            broken.append(f"{what}: {status}, not {expected[what]}")
        if seconds > 1.0:
            broken.append(f"{what}: answered after {seconds:.2f} s")
    # Only the good client's items: none of an outsized answer's.
    if report.model_items > 2 * len(report.good):
        broken.append(f"the model ran {report.model_items:.0f} items for refused answers")
    bad = [o for o in report.good if o.status != 200 or not o.correct]
    if bad or not report.good:
        broken.append(f"the good client got {dict(statuses(report.good))}")
    if report.rss_peak - report.rss_before > 32 << 20:
        broken.append(f"RSS grew {(report.rss_peak - report.rss_before) >> 20} MiB")
    return broken
