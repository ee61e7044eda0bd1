"""Open Inference Protocol v2 REST bodies, with the binary tensor data extension.

A binary request starts with a JSON header of `Inference-Header-Content-Length` bytes; each
input whose `parameters.binary_data_size` is set takes that many bytes of the rest, in input
order. A binary response is laid out the same way and says so in the same header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from carpool.contract.wire import DATATYPES
from carpool.engine.bounds import UNBOUNDED, RequestBounds
from carpool.engine.errors import BadRequest
from carpool_sidecar.bounds import check_declared_shapes, declared_bytes
from carpool_sidecar.inference import MODEL_VERSION, InferRequest, InferResponse, RequestedOutput
from carpool_sidecar.tensors import RequestTensor, binary_bytes, from_binary, from_json, json_values

HEADER_LENGTH = "Inference-Header-Content-Length"


def loads(body: bytes | bytearray | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from error


def parse_request(
    body: bytes | bytearray, header_length: int | None, bounds: RequestBounds = UNBOUNDED
) -> InferRequest:
    """The request in `body`; its declared items and bytes are checked against `bounds`
    before any tensor data is converted."""
    view = memoryview(body)
    if header_length is None:
        header_length = len(body)
    if not 0 < header_length <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} {header_length} does not fit a {len(body)}-byte body")
    check_declared_shapes(view[:header_length], bounds)
    document = loads(view[:header_length])
    if not isinstance(document, dict):
        raise BadRequest("request must be a JSON object")
    parameters = parameters_of(document, "request")
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    declared = [_declare(raw) for raw in raw_inputs]
    bounds.check_items(max(each.shape[0] for each in declared))
    bounds.check_bytes(
        sum(declared_bytes(each.datatype, each.shape, each.binary_size) for each in declared)
    )
    offset = header_length
    inputs = []
    for each, raw in zip(declared, raw_inputs, strict=True):
        tensor, offset = _convert(each, raw, view, offset)
        inputs.append(tensor)
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes of binary data belong to no input")
    return InferRequest(
        inputs=inputs,
        id=_optional_id(document.get("id")),
        outputs=_outputs(document.get("outputs")),
        binary_output=_flag(parameters, "binary_data_output"),
        priority=integer_parameter(parameters, "priority", 0),
        timeout_ms=timeout_parameter(parameters),
    )


@dataclass(frozen=True, slots=True)
class _Declared:
    """An input as its JSON header declares it, before its data is looked at."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    binary_size: int | None


def _declare(raw: Any) -> _Declared:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise BadRequest("each input must be an object with a 'name'")
    name: str = raw["name"]
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    shape = raw.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape)
    ):
        raise BadRequest(f"input {name!r}: 'shape' must be a non-empty list of counts")
    if shape[0] == 0:
        raise BadRequest(f"input {name!r}: the batch dimension must be at least 1")
    size = parameters_of(raw, f"input {name!r}").get("binary_data_size")
    if size is None:
        if "data" not in raw:
            raise BadRequest(f"input {name!r}: neither 'data' nor binary_data_size")
    elif not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"input {name!r}: binary_data_size must be a byte count, got {size!r}")
    return _Declared(name, datatype, tuple(shape), size)


def _convert(
    declared: _Declared, raw: dict[str, Any], body: memoryview, offset: int
) -> tuple[RequestTensor, int]:
    name, datatype, dims, size = (
        declared.name, declared.datatype, declared.shape, declared.binary_size
    )  # fmt: skip
    if size is None:
        return RequestTensor(
            name, datatype, dims, from_json(name, datatype, dims, raw["data"])
        ), offset
    if offset + size > len(body):
        raise BadRequest(f"input {name!r}: binary_data_size {size} runs past the body")
    data = from_binary(name, datatype, dims, body[offset : offset + size])
    return RequestTensor(name, datatype, dims, data), offset + size


def parameters_of(raw: dict[str, Any], where: str) -> dict[str, Any]:
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    return parameters


def _outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None or raw == []:
        return None  # every output
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list")
    outputs = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest("each requested output must be an object with a 'name'")
        parameters = parameters_of(entry, f"output {entry['name']!r}")
        binary = _flag(parameters, "binary_data") if "binary_data" in parameters else None
        outputs.append(RequestedOutput(entry["name"], binary))
    return outputs


def _optional_id(raw: Any) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    raise BadRequest(f"'id' must be a string, got {raw!r}")


def _flag(parameters: dict[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be true or false, got {value!r}")
    return value


def integer_parameter(parameters: dict[str, Any], key: str, default: int) -> int:
    value = parameters.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be an integer, got {value!r}")
    return value


def timeout_parameter(parameters: dict[str, Any]) -> float | None:
    """`parameters.timeout` in milliseconds; clients send it in microseconds, as for Triton."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadRequest(f"parameter 'timeout' must be microseconds > 0, got {value!r}")
    return value / 1000


def encode_response(response: InferResponse) -> tuple[list[bytes | memoryview], dict[str, str]]:
    """The body, as parts to write in turn, and headers: plain JSON, or a JSON header
    followed by the binary outputs' buffers (never joined into one copy)."""
    outputs = []
    buffers: list[bytes | memoryview] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if tensor.name in response.binary:
            buffer = binary_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(buffer)}
            buffers.append(buffer)
        else:
            entry["data"] = json_values(tensor)
        outputs.append(entry)
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": MODEL_VERSION,
        "outputs": outputs,
    }
    if response.id is not None:
        document["id"] = response.id
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return [header], {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return [header, *buffers], headers
