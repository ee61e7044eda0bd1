"""Bodies whose data outgrows the shape they declare, sent together beside good callers.

One implementation for the quick test (`test_lying_bodies.py`) and the soak
(`bench/soak.py lying_bodies`). At once: `json_bodies` OIP JSON bodies of `mib` MB of
numbers each, declared [1, 4]; one JSON body declaring `rows` rows under an escaped key
(`"sha\\u0070e"`); one binary body of `mib` MB of empty BYTES elements declared [1, 4]; one
gRPC call with `mib` MB of typed FP32 contents declared [1, 4]. And bodies whose JSON
around the data is outsized: `mib` MB of empty arrays as the data of a [1, 4] input; a
priority parameter of `mib` MB; a KServe v1 body of `mib` MB of one-number instances,
which declares no shape at all. A good client calls the toy
model every 20 ms and a prober asks /v2/health/live every 20 ms; a thread samples the
sidecar's RSS.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import orjson
from reliability.traffic import (
    Outcome,
    RssPeak,
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
    json_bodies: int = 4
    mib: int = 16  # of each lying body
    rows: int = 4_000_000  # declared under the escaped key
    seed: int = 3


@dataclass
class Report:
    body_bytes: int = 0  # all the lying bodies together
    liars: list[tuple[str, int | str, float]] = field(default_factory=list)  # what, answer, s
    good: list[Outcome] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


def lying_json(mib: int) -> bytes:
    data = b"[" + b"1.5," * (mib * 2**18 - 1) + b"1.5]"
    return b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":%s}]}' % data


def escaped_key(rows: int) -> bytes:
    data = b"[" + b"0," * (4 * rows - 1) + b"0]"
    shape = b"[%d,4]" % rows
    return b'{"inputs":[{"name":"input","datatype":"FP32","sha\\u0070e":%s,"data":%s}]}' % (
        shape,
        data,
    )


def empty_arrays(mib: int) -> bytes:
    data = b"[" + b"[]," * (mib * 2**20 // 3) + b"[1,2,3,4]]"
    return b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":%s}]}' % data


def outsized_parameter(mib: int) -> bytes:
    zeros = b"[" + b"0," * (mib * 2**19) + b"0]"
    return (
        b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}],'
        b'"parameters":{"priority":%s}}' % zeros
    )


def v1_instances(mib: int) -> bytes:
    return b'{"instances":[' + b"[0]," * (mib * 2**18) + b"[0]]}"


def lying_bytes(mib: int) -> tuple[bytes, int]:
    raw = struct.pack("<I", 0) * (mib * 2**18)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "BYTES",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, len(header)


def lying_grpc(mib: int) -> ModelInferRequest:
    request = ModelInferRequest(model_name="toy")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend(np.zeros(mib * 2**18, np.float32))
    return request


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    size = str(2 * plan.mib * 2**20)
    args = ("--max-body-bytes", size, "--grpc-max-message-bytes", size)
    with run_pair(folder, "toy", *args) as pair:
        sidecar = pair.sidecar
        pid = sidecar.process.pid
        json_body, escaped = lying_json(plan.mib), escaped_key(plan.rows)
        bytes_body, header_length = lying_bytes(plan.mib)
        message = lying_grpc(plan.mib)
        structure = {
            "empty arrays": empty_arrays(plan.mib),
            "parameter": outsized_parameter(plan.mib),
        }
        instances = v1_instances(plan.mib)
        report.body_bytes = (
            plan.json_bodies * len(json_body)
            + len(escaped)
            + len(bytes_body)
            + message.ByteSize()
            + sum(map(len, structure.values()))
            + len(instances)
        )
        async with aiohttp.ClientSession() as http:
            await call(http, sidecar, rows_for(random.Random(0), 2), 10)  # warm
            done = asyncio.Event()
            with RssPeak(pid) as rss:
                background = asyncio.gather(
                    good_client(http, sidecar, plan.seed, done, report.good),
                    _prober(http, sidecar, report, done),
                )
                await asyncio.sleep(0.2)
                liars = [
                    *(_post(http, sidecar, "json", json_body, {}) for _ in range(plan.json_bodies)),
                    _post(http, sidecar, "escaped key", escaped, {}),
                    _post(
                        http,
                        sidecar,
                        "BYTES",
                        bytes_body,
                        {"Inference-Header-Content-Length": str(header_length)},
                    ),
                    _grpc(sidecar, message),
                    *(_post(http, sidecar, what, body, {}) for what, body in structure.items()),
                    _post(http, sidecar, "v1 instances", instances, {}, route="v1"),
                ]
                report.liars = list(await asyncio.gather(*liars))
                await asyncio.sleep(0.5)
                done.set()
                await background
            report.rss_before, report.rss_peak = rss.before, rss.peak
    return report


async def _post(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    what: str,
    body: bytes,
    headers: dict[str, str],
    route: str = "v2",
) -> tuple[str, int | str, float]:
    started = time.monotonic()
    path = (
        f"v1/models/{sidecar.model}:predict"
        if route == "v1"
        else f"v2/models/{sidecar.model}/infer"
    )
    url = f"{sidecar.url}/{path}"
    async with http.post(url, data=body, headers=headers) as reply:
        await reply.read()
        return what, reply.status, time.monotonic() - started


async def _grpc(sidecar: Sidecar, message: ModelInferRequest) -> tuple[str, int | str, float]:
    started = time.monotonic()
    options = [("grpc.max_send_message_length", 2**30)]
    async with grpc.aio.insecure_channel(sidecar.grpc, options=options) as channel:
        try:
            await GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
        except grpc.aio.AioRpcError as error:
            return "gRPC typed", error.code().name, time.monotonic() - started
    return "gRPC typed", "OK", time.monotonic() - started


async def _prober(
    http: aiohttp.ClientSession, sidecar: Sidecar, report: Report, done: asyncio.Event
) -> None:
    while not done.is_set():
        started = time.monotonic()
        async with http.get(f"{sidecar.url}/v2/health/live") as reply:
            await reply.read()
        report.probes.append(time.monotonic() - started)
        await asyncio.sleep(0.02)


def summary(report: Report) -> str:
    liars = [(what, status, round(seconds, 2)) for what, status, seconds in report.liars]
    return (
        f"{report.body_bytes >> 20} MiB of lying bodies: (what, answer, s) {liars}; good client "
        f"{len(report.good)} calls {dict(statuses(report.good))}, {latency_summary(report.good)}; "
        f"/v2/health/live slowest {max(report.probes, default=0):.3f} s; sidecar RSS "
        f"{report.rss_before >> 20} MiB, peak {report.rss_peak >> 20} MiB "
        f"(+{(report.rss_peak - report.rss_before) >> 20} MiB)"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    expected = {
        "json": 400,
        "escaped key": 413,
        "BYTES": 400,
        "gRPC typed": "INVALID_ARGUMENT",
        "empty arrays": 400,
        "parameter": 400,
        "v1 instances": 413,
    }
    # Uploads share the machine, and large bodies are counted one at a time.
    allowed_s = 1.0 + 2.0 * report.body_bytes / (100 << 20)
    for what, status, seconds in report.liars:
        # 503: the bodies being read together held --max-reading-bytes.
        if status not in (expected[what], 503):
            broken.append(f"the {what} body got {status}, not {expected[what]}")
        if seconds > allowed_s:
            broken.append(f"the {what} body took {seconds:.2f} s, over {allowed_s:.1f} s")
    bad = [o for o in report.good if not (o.correct or (o.status == 503 and o.retry_after))]
    if bad or not report.good:
        broken.append(f"the good client got {dict(statuses(report.good))}")
    if max((o.seconds for o in report.good), default=0) > 1.0:
        broken.append(f"the good client waited up to {max(o.seconds for o in report.good):.2f} s")
    if max(report.probes, default=0) > 1.0:
        broken.append(f"/v2/health/live took up to {max(report.probes):.2f} s")
    # The bodies themselves, and a copy or two of the one being counted.
    largest = max(2 * plan.mib * 2**20, len(escaped_key(plan.rows)))
    if report.rss_peak - report.rss_before > report.body_bytes + 3 * largest + (64 << 20):
        broken.append(
            f"RSS grew {(report.rss_peak - report.rss_before) >> 20} MiB for "
            f"{report.body_bytes >> 20} MiB of bodies"
        )
    return broken
