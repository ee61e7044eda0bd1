"""A flood of gRPC calls, and messages that are not protobuf, at a slow model.

One implementation for the quick test (`test_grpc_flood.py`) and the soak
(`bench/soak.py grpc_flood`). The model serves 4 items per 0.1 s; `waves` times, `calls`
one-item calls start at once with a deadline of `deadline_s`, and `junk` calls send bytes
that are no ModelInferRequest. The clients' status codes are compared with the sidecar's
`carpool_requests_total{protocol="grpc"}`. The calls outrun gRPC's Python server, so some
end in gRPC's own queue: at their deadline, or refused by its backlog protection.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from support.model_server import SUPPORT_DIR
from support.sidecar import Sidecar, metric, run_pair

from carpool.contract.oip_grpc.codes import HTTP_STATUSES
from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest
from carpool.contract.oip_grpc.inference_pb2_grpc import GRPCInferenceServiceStub

CODES = ("200", "400", "429", "499", "503", "504")


@dataclass(frozen=True)
class Plan:
    waves: int = 2
    calls: int = 600
    deadline_s: float = 5.0
    junk: int = 20
    max_queue_items: int = 64


@dataclass
class Report:
    codes: Counter[str] = field(default_factory=Counter)
    without_retry_after: int = 0  # RESOURCE_EXHAUSTED without it
    counted: dict[str, float] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)  # each wave, start to last answer
    tracebacks: int = 0


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.1"}
    args = ("--max-batch-size", "4", "--max-queue-items", str(plan.max_queue_items))
    with run_pair(folder, "model_handlers:SlowInferHandler", *args, env=env) as pair:
        sidecar = pair.sidecar
        asyncio.run(_flood(sidecar, plan, report))
        report.counted = {
            code: metric(sidecar, "carpool_requests_total", protocol="grpc", code=code)
            for code in CODES
        }
        report.tracebacks = sidecar.log().count("Traceback")
    return report


def _request() -> ModelInferRequest:
    request = ModelInferRequest(model_name="toy")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return request


async def _flood(sidecar: Sidecar, plan: Plan, report: Report) -> None:
    async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
        stub = GRPCInferenceServiceStub(channel)
        junk = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        async def one(call: grpc.aio.UnaryUnaryCall[object, object]) -> None:
            try:
                await call
                report.codes["OK"] += 1
            except grpc.aio.AioRpcError as error:
                report.codes[error.code().name] += 1
                metadata = dict(error.trailing_metadata() or ())
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not metadata.get(
                    "retry-after"
                ):
                    report.without_retry_after += 1

        request = _request()
        for _ in range(plan.waves):
            started = time.monotonic()
            calls = [junk(b"\xff\xff\xff\xff", timeout=plan.deadline_s) for _ in range(plan.junk)]
            calls += [stub.ModelInfer(request, timeout=plan.deadline_s) for _ in range(plan.calls)]
            await asyncio.gather(*(one(call) for call in calls))
            report.seconds.append(time.monotonic() - started)
            await asyncio.sleep(plan.deadline_s)  # the queue drains


def seen_as_http(report: Report) -> Counter[str]:
    """The clients' codes, as the HTTP statuses the sidecar counts them by."""
    seen: Counter[str] = Counter()
    for name, count in report.codes.items():
        status = 200 if name == "OK" else HTTP_STATUSES.get(grpc.StatusCode[name], 500)
        seen[str(status)] += count
    return seen


def summary(report: Report) -> str:
    counted = {code: int(count) for code, count in report.counted.items() if count}
    return (
        f"clients saw {dict(report.codes)} ({report.without_retry_after} RESOURCE_EXHAUSTED "
        f"without retry-after); the sidecar counted {counted}; each wave took "
        f"{[round(seconds, 2) for seconds in report.seconds]} s; {report.tracebacks} tracebacks"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    # CANCELLED is gRPC's own refusal, at once, while about 1,000 calls wait in its queue.
    allowed = {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "CANCELLED"}
    if unexpected := set(report.codes) - allowed:
        broken.append(f"clients saw {sorted(unexpected)}")
    if report.without_retry_after:
        broken.append(f"{report.without_retry_after} RESOURCE_EXHAUSTED without retry-after")
    # Junk is refused INVALID_ARGUMENT once decoded, or RESOURCE_EXHAUSTED before that.
    if report.codes["INVALID_ARGUMENT"] > plan.waves * plan.junk:
        broken.append(f"{report.codes['INVALID_ARGUMENT']} INVALID_ARGUMENT for good calls")
    seen = seen_as_http(report)
    total = sum(report.codes.values())
    if sum(report.counted.values()) != total:
        broken.append(f"{total} calls made, {sum(report.counted.values()):.0f} counted")
    # A call the client gave up on may be counted 499 where it saw DEADLINE_EXCEEDED.
    for code in ("200", "400", "429"):
        counted = report.counted.get(code, 0)
        if counted != seen[code]:
            broken.append(f"clients saw {seen[code]} x {code}, the sidecar counted {counted:.0f}")
    if report.tracebacks:
        broken.append(f"{report.tracebacks} tracebacks in the sidecar's log")
    return broken
