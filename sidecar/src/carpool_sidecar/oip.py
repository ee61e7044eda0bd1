"""Open Inference Protocol v2 REST bodies, with the binary tensor data extension.

A binary request starts with a JSON header of `Inference-Header-Content-Length` bytes; each
input whose `parameters.binary_data_size` is set takes that many bytes of the rest, in input
order. A binary response is laid out the same way and says so in the same header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec
import orjson

from carpool.contract.wire import BYTES, DATATYPES
from carpool.engine.bounds import UNBOUNDED, RequestBounds
from carpool.engine.errors import BadRequest
from carpool_sidecar import counting
from carpool_sidecar.bounds import declared_bytes
from carpool_sidecar.inference import MODEL_VERSION, InferRequest, InferResponse, RequestedOutput
from carpool_sidecar.tensors import (
    MAX_DIMS,
    RequestTensor,
    binary_bytes,
    check_count,
    element_count,
    from_binary,
    from_json,
    json_values,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
T = TypeVar("T")


def loads(body: bytes | bytearray | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from error


# A request names a few inputs and outputs, each an object with an object of parameters:
# far fewer objects than this, which decode in well under a millisecond.
MAX_OBJECTS = 1024
# Parameters are scalars; any other value is refused before it becomes objects.
Scalar = bool | int | float | str | None
# Decoders made once: `msgspec.json.decode(text, type=...)` looks its type up on every call,
# a microsecond for a union, far more than decoding a parameter takes.
_SCALAR = msgspec.json.Decoder(Scalar)
_DIMS = msgspec.json.Decoder(list[int])
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


class _OutputParameters(msgspec.Struct):
    binary_data: msgspec.Raw = msgspec.Raw()


class _Output(msgspec.Struct):
    name: str | None = None
    parameters: _OutputParameters | None = None


class _InputParameters(msgspec.Struct):
    binary_data_size: msgspec.Raw = msgspec.Raw()


class _Input(msgspec.Struct):
    name: str | None = None
    datatype: str | None = None
    # Kept as text: its dimensions are counted before they are decoded.
    shape: msgspec.Raw = msgspec.Raw()
    parameters: _InputParameters | None = None
    # Kept as its text: counted against the shape before it is converted. Empty: absent.
    data: msgspec.Raw = msgspec.Raw()


class _Parameters(msgspec.Struct):
    binary_data_output: msgspec.Raw = msgspec.Raw()
    priority: msgspec.Raw = msgspec.Raw()
    timeout: msgspec.Raw = msgspec.Raw()


class _Document(msgspec.Struct):
    """The request's JSON as msgspec reads it: a real parser, so an escaped key is the key
    it spells, and the parts the sidecar does not read (unknown keys and parameters, the
    data) become no objects."""

    inputs: list[_Input] | None = None
    outputs: list[_Output] | None = None
    id: msgspec.Raw = msgspec.Raw()
    parameters: _Parameters | None = None


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
    document = _decode(body, header_length)
    parameters = scalar_parameters(document.parameters)
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


def _decode(body: bytes | bytearray, header_length: int) -> _Document:
    """The JSON header, once it is known to hold at most MAX_OBJECTS objects."""
    if body.count(b"{", 0, header_length) > MAX_OBJECTS:  # strings' braces counted too
        found = counting.objects(bytes(memoryview(body)[:header_length]))
        if found > MAX_OBJECTS:
            raise BadRequest(
                f"the request holds {found} JSON objects, more than {MAX_OBJECTS}: it names "
                "each input and output once"
            )
    return decode(memoryview(body)[:header_length], _Document)


def decode(text: bytes | bytearray | memoryview, kind: type[T]) -> T:
    """`text` as JSON of `kind`; BadRequest says what is wrong with it."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return cast(T, decoder.decode(text))
    except msgspec.ValidationError as error:
        raise BadRequest(f"request does not follow the protocol: {error}") from error
    except msgspec.DecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from error
    except UnicodeDecodeError as error:  # JSON text is UTF-8 (RFC 8259)
        raise BadRequest(f"body is not valid JSON: a string is not UTF-8 text ({error})") from None


def scalar_parameters(raw: msgspec.Struct | None, *texts: str) -> dict[str, Scalar]:
    """The parameters the sidecar reads, each a scalar, by name, but for `texts`, read
    otherwise; unknown parameters were skipped."""
    if raw is None:
        return {}
    decoded = {}
    for key in raw.__struct_fields__:
        if key in texts:
            continue
        value: msgspec.Raw = getattr(raw, key)
        if not value:
            continue
        try:
            decoded[key] = _SCALAR.decode(value)
        except msgspec.ValidationError:
            raise BadRequest(f"parameter {key!r} must be a number, a string or a boolean") from None
        except UnicodeDecodeError:  # a raw value's strings are read only here
            raise BadRequest(f"parameter {key!r} is not UTF-8 text") from None
    return decoded


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
    if datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    shape = _shape(name, raw.shape)
    size = scalar_parameters(raw.parameters).get("binary_data_size")
    if size is None:
        if not raw.data:
            raise BadRequest(f"input {name!r}: neither 'data' nor binary_data_size")
    elif not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"input {name!r}: binary_data_size must be a byte count, got {size!r}")
    return _Declared(name, datatype, tuple(shape), size)


def _shape(name: str, raw: msgspec.Raw) -> tuple[int, ...]:
    """The declared shape, its dimensions counted before they are decoded."""
    if bytes(raw).count(b",") >= MAX_DIMS:
        raise BadRequest(f"input {name!r}: 'shape' has more than {MAX_DIMS} dimensions")
    try:
        shape = _DIMS.decode(raw) if raw else []
    except msgspec.ValidationError:
        shape = []
    if not shape or any(dim < 0 for dim in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a non-empty list of counts")
    if shape[0] == 0:
        raise BadRequest(f"input {name!r}: the batch dimension must be at least 1")
    return tuple(shape)


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


def _outputs(raw: list[_Output] | None) -> list[RequestedOutput] | None:
    if not raw:
        return None  # every output
    outputs = []
    for entry in raw:
        if not isinstance(entry.name, str):
            raise BadRequest("each requested output must be an object with a 'name'")
        parameters = scalar_parameters(entry.parameters)
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
    try:
        value: str = msgspec.json.decode(raw)
    except UnicodeDecodeError:  # the raw value's string is read only here
        raise BadRequest("'id' is not UTF-8 text") from None
    return value


def _flag(parameters: dict[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be true or false, got {value!r}")
    return value


def integer_parameter(parameters: dict[str, Any], key: str, default: int) -> int:
    value = parameters.get(key)
    if value is None:  # null: not given, as for every other parameter
        return default
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
