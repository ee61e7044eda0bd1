"""Open Inference Protocol v2 REST bodies, with the binary tensor data extension.

A binary request starts with a JSON header of `Inference-Header-Content-Length` bytes; each
input whose `parameters.binary_data_size` is set takes that many bytes of the rest, in input
order. A binary response is laid out the same way and says so in the same header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from carpool.contract.wire import BYTES, DATATYPES
from carpool.engine.bounds import UNBOUNDED, RequestBounds
from carpool.engine.errors import BadRequest
from carpool_sidecar import counting
from carpool_sidecar.bounds import declared_bytes
from carpool_sidecar.inference import MODEL_VERSION, InferRequest, InferResponse, RequestedOutput
from carpool_sidecar.tensors import (
    RequestTensor,
    binary_bytes,
    check_count,
    element_count,
    from_binary,
    from_json,
    json_values,
)

HEADER_LENGTH = "Inference-Header-Content-Length"


def loads(body: bytes | bytearray | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from error


class _Output(msgspec.Struct):
    name: Any = None
    parameters: dict[str, msgspec.Raw] | None = None


class _Input(msgspec.Struct):
    name: Any = None
    datatype: Any = None
    shape: Any = None
    parameters: dict[str, msgspec.Raw] | None = None
    # Kept as its text: counted against the shape before it is converted. Empty: absent.
    data: msgspec.Raw = msgspec.Raw()


class _Document(msgspec.Struct):
    """The request's JSON as msgspec reads it: a real parser, so an escaped key is the key
    it spells, and the parts the sidecar does not read (unknown keys and parameters, the
    data) become no objects."""

    inputs: list[_Input] | None = None
    outputs: list[_Output] | None = None
    id: msgspec.Raw = msgspec.Raw()
    parameters: dict[str, msgspec.Raw] | None = None


def parse_request(
    body: bytes | bytearray, header_length: int | None, bounds: RequestBounds = UNBOUNDED
) -> InferRequest:
    """The request in `body`; its declared items and bytes are checked against `bounds`, and
    each input's data against its shape, before any tensor data is converted."""
    view = memoryview(body)
    if header_length is None:
        header_length = len(body)
    if not 0 < header_length <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} {header_length} does not fit a {len(body)}-byte body")
    document = _decode(view[:header_length])
    parameters = _parameters(document.parameters, ("binary_data_output", "priority", "timeout"))
    if not document.inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    declared = [_declare(raw) for raw in document.inputs]
    bounds.check_items(max(each.shape[0] for each in declared))
    bounds.check_bytes(
        sum(declared_bytes(each.datatype, each.shape, each.binary_size) for each in declared)
    )
    offset = header_length
    inputs = []
    for each, raw in zip(declared, document.inputs, strict=True):
        tensor, offset = _convert(each, raw.data, view, offset)
        inputs.append(tensor)
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes of binary data belong to no input")
    return InferRequest(
        inputs=inputs,
        id=_optional_id(document.id),
        outputs=_outputs(document.outputs),
        binary_output=_flag(parameters, "binary_data_output"),
        priority=integer_parameter(parameters, "priority", 0),
        timeout_ms=timeout_parameter(parameters),
    )


def _decode(header: memoryview) -> _Document:
    try:
        return msgspec.json.decode(header, type=_Document)
    except msgspec.ValidationError as error:
        raise BadRequest(f"request does not follow the protocol: {error}") from error
    except msgspec.DecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from error


def _parameters(raw: dict[str, msgspec.Raw] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    """The parameters the sidecar reads, decoded; the others stay text."""
    raw = raw or {}
    return {key: msgspec.json.decode(raw[key]) for key in keys if key in raw}


@dataclass(frozen=True, slots=True)
class _Declared:
    """An input as its JSON header declares it, before its data is looked at."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    binary_size: int | None


def _declare(raw: _Input) -> _Declared:
    if not isinstance(raw.name, str):
        raise BadRequest("each input must be an object with a 'name'")
    name: str = raw.name
    datatype = raw.datatype
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    shape = raw.shape
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape)
    ):
        raise BadRequest(f"input {name!r}: 'shape' must be a non-empty list of counts")
    if shape[0] == 0:
        raise BadRequest(f"input {name!r}: the batch dimension must be at least 1")
    size = _parameters(raw.parameters, ("binary_data_size",)).get("binary_data_size")
    if size is None:
        if not raw.data:
            raise BadRequest(f"input {name!r}: neither 'data' nor binary_data_size")
    elif not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"input {name!r}: binary_data_size must be a byte count, got {size!r}")
    return _Declared(name, datatype, tuple(shape), size)


def _convert(
    declared: _Declared, data: msgspec.Raw, body: memoryview, offset: int
) -> tuple[RequestTensor, int]:
    name, datatype, dims, size = (
        declared.name, declared.datatype, declared.shape, declared.binary_size
    )  # fmt: skip
    if size is None:
        text = bytes(data)
        have, arrays = counting.elements(
            name, datatype, text, element_count(dims), datatype == BYTES
        )
        check_count(name, dims, have)
        counting.check_arrays(name, dims, arrays)
        values = from_json(name, datatype, dims, loads(text))
        return RequestTensor(name, datatype, dims, values), offset
    if offset + size > len(body):
        raise BadRequest(f"input {name!r}: binary_data_size {size} runs past the body")
    values = from_binary(name, datatype, dims, body[offset : offset + size])
    return RequestTensor(name, datatype, dims, values), offset + size


def parameters_of(raw: dict[str, Any], where: str) -> dict[str, Any]:
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    return parameters


def _outputs(raw: list[_Output] | None) -> list[RequestedOutput] | None:
    if not raw:
        return None  # every output
    outputs = []
    for entry in raw:
        if not isinstance(entry.name, str):
            raise BadRequest("each requested output must be an object with a 'name'")
        parameters = _parameters(entry.parameters, ("binary_data",))
        binary = _flag(parameters, "binary_data") if "binary_data" in parameters else None
        outputs.append(RequestedOutput(entry.name, binary))
    return outputs


def _optional_id(raw: msgspec.Raw) -> str | None:
    # Decoded only when it is a string: an id of another kind becomes no object.
    start = bytes(memoryview(raw)[:4])
    if not start or start == b"null":
        return None
    if not start.startswith(b'"'):
        raise BadRequest(f"'id' must be a string, got {start.decode(errors='replace')}...")
    value: str = msgspec.json.decode(raw)
    return value


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
