"""Each gRPC status the sidecar answers, provoked against a real sidecar and model server.

The model takes 0.3 s per batch and the sidecar sends one item at a time, so a first
"blocker" call keeps the model busy while a test arranges the queue behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from support.model_server import SUPPORT_DIR
from support.sidecar import (
    Pair,
    Sidecar,
    metric,
    model_items,
    run_pair,
    run_sidecar,
    until,
    wait_for,
)

tritongrpc = pytest.importorskip("tritonclient.grpc")
service_pb2 = tritongrpc.service_pb2
service_pb2_grpc = tritongrpc.service_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
SIDECAR_ARGS = ("--max-batch-size", "1", "--max-inflight-batches", "1", "--max-queue-items", "3")
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.3"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("grpc-errors")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", *SIDECAR_ARGS, env=SLOW) as both:
        yield both


@pytest.fixture
async def stub(pair: Pair) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(pair.sidecar.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def toy_request(rows: list[list[float]], model: str = "toy", **parameters: int) -> Any:
    data = np.array(rows, dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=data.shape)
    request.raw_input_contents.append(data.tobytes())
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


async def start_blocker(stub: Any, sidecar: Sidecar) -> asyncio.Future[Any]:
    await until(sidecar, "carpool_inflight_batches", 0)
    blocker = asyncio.ensure_future(stub.ModelInfer(toy_request([[0, 0, 0, 0]])))
    await until(sidecar, "carpool_inflight_batches", 1)
    return blocker


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    return failed.value


async def test_bad_input_is_invalid_argument(pair: Pair, stub: Any) -> None:
    error = await refused(stub.ModelInfer(toy_request([[1, 2, 3]])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shape [1, 3]" in (error.details() or "")
    request = toy_request([[1, 2, 3, 4]])
    request.raw_input_contents.append(b"spare")
    error = await refused(stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    code = metric(pair.sidecar, "carpool_requests_total", protocol="grpc", code="400")
    assert code >= 2


async def test_a_message_naming_a_long_value_keeps_its_code(stub: Any) -> None:
    """gRPC sends the message percent-encoded in a trailer, which clients refuse past 16 KiB
    (RESOURCE_EXHAUSTED): the message is cut short instead."""
    request = toy_request([[1, 2, 3, 4]])
    request.outputs.add(name="é" * 6_000)
    error = await refused(stub.ModelInfer(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert (error.details() or "").startswith("unknown output 'éé")


async def test_unknown_model_is_not_found(stub: Any) -> None:
    for call in (
        stub.ModelInfer(toy_request([[1, 2, 3, 4]], model="nope")),
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope")),
        stub.ModelReady(service_pb2.ModelReadyRequest(name="toy", version="7")),
    ):
        error = await refused(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown" in (error.details() or "")


async def test_full_queue_is_resource_exhausted_with_retry_after(pair: Pair, stub: Any) -> None:
    sidecar = pair.sidecar
    refused_before = metric(sidecar, "carpool_rejected_total", reason="queue_full")
    blocker = await start_blocker(stub, sidecar)
    queued = [asyncio.ensure_future(stub.ModelInfer(toy_request([[1, 1, 1, 1]]))) for _ in range(3)]
    await until(sidecar, "carpool_queue_items", 3)
    error = await refused(stub.ModelInfer(toy_request([[2, 2, 2, 2]])))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The blocker and 3 queued calls: as many as the sidecar holds items.
    assert "queue full: 4 gRPC calls in flight" in (error.details() or "")
    trailers = dict(error.trailing_metadata() or ())
    assert int(trailers["retry-after"]) >= 1
    answers = await asyncio.gather(blocker, *queued)
    assert all(len(answer.raw_output_contents) == 1 for answer in answers)
    assert metric(sidecar, "carpool_rejected_total", reason="queue_full") == refused_before + 1


@pytest.mark.parametrize("how", ["grpc-deadline", "timeout-parameter"])
async def test_deadline_while_queued_is_deadline_exceeded_and_skips_the_model(
    pair: Pair, stub: Any, how: str
) -> None:
    sidecar = pair.sidecar
    items_before = model_items(pair.model_server)
    late_before = metric(sidecar, "carpool_requests_total", protocol="grpc", code="504")
    blocker = await start_blocker(stub, sidecar)
    if how == "grpc-deadline":
        call = stub.ModelInfer(toy_request([[1, 1, 1, 1]]), timeout=0.1)
    else:  # microseconds, as tritonclient sends it; the server's own refusal
        call = stub.ModelInfer(toy_request([[1, 1, 1, 1]], timeout=100_000))
    error = await refused(call)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await blocker
    await until(sidecar, "carpool_inflight_batches", 0)
    assert model_items(pair.model_server) == items_before + 1  # the blocker alone
    await until(sidecar, "carpool_queue_items", 0)
    assert metric(sidecar, "carpool_requests_total", protocol="grpc", code="504") == late_before + 1


async def test_cancelled_call_is_never_sent(pair: Pair, stub: Any) -> None:
    sidecar = pair.sidecar
    gone_before = metric(sidecar, "carpool_requests_total", protocol="grpc", code="499")
    items_before = model_items(pair.model_server)
    blocker = await start_blocker(stub, sidecar)
    leaving = stub.ModelInfer(toy_request([[5, 5, 5, 5]]))
    await until(sidecar, "carpool_queue_items", 1)
    leaving.cancel()
    await until(sidecar, "carpool_queue_items", 0)
    await blocker
    await until(sidecar, "carpool_inflight_batches", 0)
    assert model_items(pair.model_server) == items_before + 1  # the blocker alone
    await asyncio.to_thread(
        wait_for,
        lambda: (
            metric(sidecar, "carpool_requests_total", protocol="grpc", code="499")
            == gone_before + 1
        ),
    )


def test_model_server_down_is_unavailable(tmp_path: Path) -> None:
    nothing = f"unix://{tmp_path / 'none.sock'}"
    with (
        run_sidecar(tmp_path, nothing, wait_ready=False) as sidecar,
        grpc.insecure_channel(sidecar.grpc) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(toy_request([[1, 2, 3, 4]]))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not ready" in failed.value.details()
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
        assert not stub.ServerReady(service_pb2.ServerReadyRequest()).ready


async def test_a_message_that_is_not_protobuf_is_invalid_argument(pair: Pair) -> None:
    """Refused with one status and no traceback, where grpc's own decoding answered UNKNOWN
    and logged seven lines per call."""
    sidecar = pair.sidecar
    bad_before = metric(sidecar, "carpool_requests_total", protocol="grpc", code="400")
    async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(3):
            error = await refused(call(b"\xff\xff\xff\xff"))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a ModelInferRequest" in (error.details() or "")
    assert metric(sidecar, "carpool_requests_total", protocol="grpc", code="400") == bad_before + 3
    assert "Traceback" not in sidecar.log()


async def test_a_flood_is_refused_with_retry_after_and_every_call_is_counted(pair: Pair) -> None:
    """800 calls at once at a sidecar that holds 4 items: RESOURCE_EXHAUSTED with
    retry-after for the excess, and /metrics counts every call the clients made."""
    sidecar = pair.sidecar
    codes = ("200", "429", "499", "504", "503")

    def counted() -> float:
        return sum(
            metric(sidecar, "carpool_requests_total", protocol="grpc", code=code) for code in codes
        )

    before = counted()
    async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelInfer(toy_request([[1, 1, 1, 1]]), timeout=5) for _ in range(800)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    errors = [outcome for outcome in outcomes if isinstance(outcome, grpc.aio.AioRpcError)]
    exhausted = [e for e in errors if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(exhausted) > 700, {e.code() for e in errors}
    assert all(int(dict(e.trailing_metadata() or ())["retry-after"]) >= 1 for e in exhausted)
    assert {e.code() for e in errors} <= {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
    await asyncio.to_thread(wait_for, lambda: counted() == before + 800, 10.0, "800 counted")


def test_message_over_the_limit_is_resource_exhausted(tmp_path: Path) -> None:
    nothing = f"unix://{tmp_path / 'none.sock'}"
    limit = ("--grpc-max-message-bytes", "1000")
    with (
        run_sidecar(tmp_path, nothing, *limit, wait_ready=False) as sidecar,
        grpc.insecure_channel(sidecar.grpc) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(toy_request([[1, 2, 3, 4]] * 100))
        assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_calls_the_sidecar_answers_are_never_counted_as_ended_by_grpc(
    pair: Pair, stub: Any
) -> None:
    """Only a call that no handler saw counts as ended by gRPC (504): health checks,
    metadata and an unknown method are all answered by the sidecar's own code."""
    sidecar = pair.sidecar
    late_before = metric(sidecar, "carpool_requests_total", protocol="grpc", code="504")
    for _ in range(20):
        assert (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
        await stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="toy"))
    async with grpc.aio.insecure_channel(sidecar.grpc) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        unknown = channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex")
        for _ in range(20):
            assert (await check(health_pb2.HealthCheckRequest())).status == SERVING
            error = await refused(unknown(b""))
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert metric(sidecar, "carpool_requests_total", protocol="grpc", code="504") == late_before
