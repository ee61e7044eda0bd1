"""Triton's gRPC clients against a real sidecar: every datatype, raw and typed contents.

The model (every_type_handler) returns each input's elements reversed, so every answer
is checked value by value, in its own datatype.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.every_type_handler import ALL_DATATYPES, input_name, output_name
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, metric, run_pair

tritongrpc = pytest.importorskip("tritonclient.grpc")
tritonaio = pytest.importorskip("tritonclient.grpc.aio")
service_pb2 = tritongrpc.service_pb2
service_pb2_grpc = tritongrpc.service_pb2_grpc

# Datatypes with a field of their own in InferTensorContents (not FP16, not BF16).
TYPED = tuple(kind for kind in ALL_DATATYPES if kind not in ("FP16", "BF16"))
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def values(datatype: str) -> np.ndarray[Any, Any]:
    """Two items of three elements each, at the edges of the datatype's range."""
    if datatype == "BOOL":
        return np.array([[True, False, False], [False, True, True]])
    if datatype == "BYTES":
        texts = [[b"carpool", b"", b"\x00\xff"], [b"a", b"bc", "caf\u00e9".encode()]]
        return np.array(texts, dtype=object)
    if datatype == "BF16":
        return np.array([[1.0, -2.5, 0.15625], [3.0e38, -0.0, 7.0]], dtype=ml_dtypes.bfloat16)
    dtype = np.dtype(datatype.lower().replace("fp", "float"))
    if dtype.kind == "f":
        info = np.finfo(dtype)
        return np.array([[1 / 3, -2.5, info.max], [info.tiny, 0.0, -1e-3]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, info.max, 1], [0, 7, info.max - 1]], dtype=dtype)


def expected(datatype: str) -> np.ndarray[Any, Any]:
    return values(datatype)[:, ::-1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("every-type")
    env = {"PYTHONPATH": str(SUPPORT_DIR)}
    with run_pair(tmp_path, "every_type_handler:EveryTypeHandler", env=env, model="every") as both:
        yield both


@pytest.fixture(scope="module")
def typed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("typed")
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_DATATYPES": ",".join(TYPED)}
    with run_pair(tmp_path, "every_type_handler:EveryTypeHandler", env=env, model="typed") as both:
        yield both


def triton_inputs(datatypes: tuple[str, ...]) -> list[Any]:
    inputs = []
    for datatype in datatypes:
        data = values(datatype)
        tensor = tritongrpc.InferInput(input_name(datatype), list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def check(datatype: str, got: np.ndarray[Any, Any]) -> None:
    want = expected(datatype)
    assert got.shape == want.shape, datatype
    if datatype == "BYTES":
        assert [bytes(value) for value in got.ravel()] == list(want.ravel())
    elif datatype == "BF16":
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    else:
        np.testing.assert_array_equal(got, want, err_msg=datatype)


def test_metadata_readiness_and_health(pair: Pair) -> None:
    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("every") and client.is_model_ready("every", "1")
        metadata = client.get_model_metadata("every", as_json=True)
        assert metadata["versions"] == ["1"]
        assert {tensor["datatype"] for tensor in metadata["inputs"]} == set(ALL_DATATYPES)
        assert all(tensor["shape"] == ["-1", "3"] for tensor in metadata["outputs"])
        assert client.get_server_metadata().name == "carpool"
    finally:
        client.close()
    with grpc.insecure_channel(pair.sidecar.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "liveness"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nothing"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_sync_client_every_datatype_raw(pair: Pair) -> None:
    client = tritongrpc.InferenceServerClient(pair.sidecar.grpc)
    try:
        result = client.infer("every", triton_inputs(ALL_DATATYPES), request_id="r-1")
    finally:
        client.close()
    assert result.get_response().id == "r-1"
    for datatype in ALL_DATATYPES:
        check(datatype, result.as_numpy(output_name(datatype)))
    assert metric(pair.sidecar, "carpool_requests_total", protocol="grpc", code="200") >= 1


async def test_aio_client_every_datatype_and_output_selection(pair: Pair) -> None:
    client = tritonaio.InferenceServerClient(pair.sidecar.grpc)
    try:
        chosen = ["FP16", "BYTES"]
        outputs = [tritonaio.InferRequestedOutput(output_name(kind)) for kind in chosen]
        result = await client.infer(
            "every", triton_inputs(ALL_DATATYPES), outputs=outputs, priority=5, timeout=10_000_000
        )
        everything = await client.infer("every", triton_inputs(ALL_DATATYPES))
    finally:
        await client.close()
    names = [output.name for output in result.get_response().outputs]
    assert names == [output_name(kind) for kind in chosen]
    for datatype in chosen:
        check(datatype, result.as_numpy(datatype and output_name(datatype)))
    for datatype in ALL_DATATYPES:
        check(datatype, everything.as_numpy(output_name(datatype)))


def typed_request(model: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    for datatype in TYPED:
        data = values(datatype)
        tensor = request.inputs.add(name=input_name(datatype), datatype=datatype, shape=data.shape)
        getattr(tensor.contents, CONTENTS_FIELDS[datatype]).extend(data.ravel().tolist())
    return request


@pytest.mark.parametrize("typed_out", [True, False], ids=["typed-out", "raw-out"])
def test_typed_contents_in(typed_pair: Pair, typed_out: bool) -> None:
    """Tensors in InferTensorContents, sent with Triton's own generated stub."""
    request = typed_request("typed")
    if typed_out:
        request.parameters["binary_data_output"].bool_param = False
    with grpc.insecure_channel(typed_pair.sidecar.grpc) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert [output.name for output in response.outputs] == [output_name(kind) for kind in TYPED]
    assert len(response.raw_output_contents) == (0 if typed_out else len(TYPED))
    result = tritongrpc.InferResult(response)
    for index, datatype in enumerate(TYPED):
        output = response.outputs[index]
        assert list(output.shape) == [2, 3]
        if not typed_out:
            check(datatype, result.as_numpy(output.name))
            continue
        got = list(getattr(output.contents, CONTENTS_FIELDS[datatype]))
        want = expected(datatype).ravel().tolist()
        if datatype == "FP32":  # float32 values, read back as Python floats
            want = [float(np.float32(value)) for value in want]
        assert got == want, datatype


def test_typed_value_out_of_range_is_invalid_argument(typed_pair: Pair) -> None:
    request = typed_request("typed")
    int8 = next(tensor for tensor in request.inputs if tensor.datatype == "INT8")
    int8.contents.int_contents[0] = 300
    with (
        grpc.insecure_channel(typed_pair.sidecar.grpc) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "out of range for INT8" in refused.value.details()
