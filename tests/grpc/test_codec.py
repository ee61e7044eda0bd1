"""The gRPC codec in process: requests it refuses, and the form of its answers."""

from __future__ import annotations

import numpy as np
import pytest
from support.memory import peak_bytes

from carpool.contract.oip_grpc.inference_pb2 import ModelInferRequest
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import BadRequest, PayloadTooLarge
from carpool_sidecar.grpc.codec import encode_response, parse_request
from carpool_sidecar.inference import InferResponse
from carpool_sidecar.tensors import RequestTensor


def request_with(datatype: str = "FP32", shape: tuple[int, ...] = (1, 2)) -> ModelInferRequest:
    request = ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    return request


def test_typed_data_in_the_wrong_field_names_the_right_one() -> None:
    request = request_with("FP32")
    request.inputs[0].contents.int_contents.extend([1, 2])
    with pytest.raises(BadRequest, match="belongs in fp32_contents"):
        parse_request(request)


def test_fp16_has_no_typed_field() -> None:
    request = request_with("FP16")
    with pytest.raises(BadRequest, match="only in raw_input_contents"):
        parse_request(request)


def test_raw_contents_are_for_every_input_or_none() -> None:
    request = request_with()
    request.inputs.add(name="y", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    with pytest.raises(BadRequest, match="1 entries for 2 inputs"):
        parse_request(request)


def test_parameters_as_triton_clients_send_them() -> None:
    request = request_with()
    request.inputs[0].contents.fp32_contents.extend([0.5, 1.5])
    request.parameters["priority"].uint64_param = 3
    request.parameters["timeout"].int64_param = 250_000  # microseconds
    request.parameters["sequence_start"].bool_param = False  # not ours: ignored
    parsed = parse_request(request)
    assert parsed.priority == 3 and parsed.timeout_ms == 250
    np.testing.assert_array_equal(parsed.inputs[0].data, [0.5, 1.5])
    request.parameters["priority"].string_param = "high"
    with pytest.raises(BadRequest, match="'priority' must be a number"):
        parse_request(request)


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_a_timeout_that_is_no_time_is_refused(timeout: float) -> None:
    """As the REST header's: a NaN deadline would be ignored, not refused."""
    request = request_with()
    request.inputs[0].contents.fp32_contents.extend([0.5, 1.5])
    request.parameters["timeout"].double_param = timeout
    with pytest.raises(BadRequest, match="'timeout' must be microseconds > 0"):
        parse_request(request)


def test_outputs_are_raw_unless_typed_is_asked_and_possible() -> None:
    fp32 = RequestTensor("a", "FP32", (1, 2), np.array([1.0, 2.0], np.float32))
    fp16 = RequestTensor("b", "FP16", (1, 2), np.array([1.0, 2.0], np.float16))
    raw = encode_response(InferResponse("m", "id-1", [fp32], frozenset({"a"})))
    assert raw.id == "id-1" and raw.raw_output_contents == [fp32.data.tobytes()]
    typed = encode_response(InferResponse("m", None, [fp32], frozenset()))
    assert not typed.raw_output_contents
    assert list(typed.outputs[0].contents.fp32_contents) == [1.0, 2.0]
    # FP16 has no typed field, and a response is all raw or all typed.
    mixed = encode_response(InferResponse("m", None, [fp32, fp16], frozenset()))
    assert len(mixed.raw_output_contents) == 2
    assert not mixed.outputs[0].HasField("contents")


def test_typed_contents_beyond_the_shape_are_refused_before_they_are_converted() -> None:
    """A million floats for a [1, 4] tensor: counted, not converted (an object each)."""
    request = request_with("FP32", (1, 4))
    request.inputs[0].contents.fp32_contents.extend(np.zeros(1_000_000, np.float32))
    peak, raised = peak_bytes(lambda: parse_request(request))
    assert isinstance(raised, BadRequest) and "needs 4 elements, got 1000000" in raised.message
    assert peak < 1 << 20, f"{peak >> 20} MiB"


def test_declared_items_and_bytes_are_bounded_before_the_data_is_read() -> None:
    bounds = RequestBounds(max_items=8, max_bytes=4096)
    request = request_with("FP32", (9, 4))
    with pytest.raises(PayloadTooLarge, match="9 items, more than maxQueueItems 8"):
        parse_request(request, bounds)
    request = request_with("FP32", (1, 4))
    request.raw_input_contents.append(bytes(8192))
    with pytest.raises(PayloadTooLarge, match="8192 bytes"):
        parse_request(request, bounds)


def test_a_shape_of_more_dimensions_than_numpy_holds_is_refused_before_it_is_read() -> None:
    request = request_with("FP32", (1,) * 1_000_000 + (4,))
    request.inputs[0].contents.fp32_contents.extend([1, 2, 3, 4])
    peak, raised = peak_bytes(lambda: parse_request(request))
    assert isinstance(raised, BadRequest) and "more than 64 dimensions" in raised.message, raised
    assert peak < 1 << 20, f"{peak >> 20} MiB"
