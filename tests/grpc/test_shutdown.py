"""SIGTERM with gRPC calls queued: the drain answers them, new calls are turned away."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.model_server import SUPPORT_DIR
from support.sidecar import metric, run_pair, wait_for

tritongrpc = pytest.importorskip("tritonclient.grpc")
service_pb2 = tritongrpc.service_pb2
service_pb2_grpc = tritongrpc.service_pb2_grpc

SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.5"}
ONE_AT_A_TIME = ("--max-batch-size", "1", "--max-inflight-batches", "1")
# No drain delay: the sidecar stops accepting at once (with a delay it serves new calls while
# endpoints go, which the REST shutdown scenarios cover).
NO_DELAY = ("--drain-delay-seconds", "0")


def toy_request(value: float) -> Any:
    request = service_pb2.ModelInferRequest(model_name="toy")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.full(4, value, dtype=np.float32).tobytes())
    return request


async def test_sigterm_answers_queued_calls_and_refuses_new_ones(tmp_path: Path) -> None:
    with run_pair(
        tmp_path, "model_handlers:SlowInferHandler", *ONE_AT_A_TIME, *NO_DELAY, env=SLOW
    ) as pair:
        sidecar = pair.sidecar
        async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            calls = [asyncio.ensure_future(stub.ModelInfer(toy_request(v))) for v in (1, 2, 3)]
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_queue_items") == 2, 10.0, "2 queued"
            )
            sidecar.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)  # the drain has begun; the queue takes ~1 s more
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(toy_request(9))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            answers = await asyncio.gather(*calls)
        for value, answer in zip((1, 2, 3), answers, strict=True):
            output = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32)
            np.testing.assert_array_equal(output, np.full(4, 2 * value + 1, dtype=np.float32))
        assert sidecar.process.wait(15) == 0


@pytest.mark.serial  # times the exit against the drain it would otherwise wait out
async def test_sigterm_ends_open_streams_once_their_requests_are_answered(tmp_path: Path) -> None:
    """A client keeps its ModelStreamInfer stream open between requests, as tritonclient
    does: after SIGTERM the request in flight gets its answer, then the stream ends with
    UNAVAILABLE (open a new one elsewhere) instead of holding the sidecar's exit for the
    whole drain."""
    drain = ("--drain-seconds", "30")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *NO_DELAY, *drain, env=SLOW) as pair:
        sidecar = pair.sidecar
        async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            idle, busy = stub.ModelStreamInfer(), stub.ModelStreamInfer()
            await idle.write(toy_request(1))
            await idle.read()  # answered; the stream stays open with nothing in flight
            await busy.write(toy_request(2))
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_queue_items") == 0, 10.0, "sent"
            )
            started = time.monotonic()
            sidecar.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):  # well within the drain of 30 s
                answer = await busy.read()
                output = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)
                np.testing.assert_array_equal(output, np.full(4, 5, dtype=np.float32))
                for stream in (idle, busy):
                    with pytest.raises(grpc.aio.AioRpcError) as ended:
                        await stream.read()
                    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert sidecar.process.wait(25) == 0
        assert time.monotonic() - started < 10


async def test_a_front_slow_to_close_does_not_stretch_the_drain(tmp_path: Path) -> None:
    """The drain's grace counts from its start, whatever the fronts take to close their port:
    a gRPC call whose batch outlasts it ends UNAVAILABLE (retry elsewhere) when the grace
    is over, not once a stalled front has answered or been given up on."""
    slow = {**SLOW, "CARPOOL_TEST_INFER_S": "4"}
    drain = ("--drain-seconds", "0.5", "--max-inflight-batches", "1", "--front-processes", "2")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *drain, *NO_DELAY, env=slow) as pair:
        sidecar = pair.sidecar
        async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            held = asyncio.ensure_future(stub.ModelInfer(toy_request(1)))
            await asyncio.to_thread(
                wait_for, lambda: metric(sidecar, "carpool_inflight_batches") == 1
            )
            stalled = psutil.Process(sidecar.process.pid).children()[0]
            stalled.suspend()
            try:
                sidecar.process.send_signal(signal.SIGTERM)
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    await held
                waited = time.monotonic() - started
            finally:
                stalled.resume()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
        assert waited < 1.5, f"answered {waited:.1f} s after SIGTERM, the grace is 0.5 s"
        assert sidecar.process.wait(10) == 0, sidecar.log()
