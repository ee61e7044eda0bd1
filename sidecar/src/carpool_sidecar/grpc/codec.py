"""Open Inference Protocol gRPC messages <-> the sidecar's InferRequest and InferResponse.

Input data comes either all in `raw_input_contents` (little-endian bytes, as tritonclient
sends it) or each in its `contents` field of the datatype's family. Outputs go back raw,
as Triton answers and as tritonclient reads them, unless the request asks for typed
contents with `binary_data_output: false` (or `binary_data: false` on every output); FP16
and BF16 have no typed field, so a response holding one is raw throughout.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from carpool.contract.oip_grpc.inference_pb2 import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferResponse,
)
from carpool.contract.wire import BYTES, DATATYPES
from carpool.engine.bounds import UNBOUNDED, RequestBounds
from carpool.engine.errors import BadRequest
from carpool_sidecar.bounds import declared_bytes
from carpool_sidecar.inference import MODEL_VERSION, InferRequest, InferResponse, RequestedOutput
from carpool_sidecar.tensors import (
    MAX_DIMS,
    Array,
    RequestTensor,
    binary_bytes,
    check_count,
    from_binary,
    from_json,
)

# Datatype -> the InferTensorContents field that holds its values.
CONTENTS_FIELDS: dict[str, str] = {
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
    BYTES: "bytes_contents",
}
# The numpy dtype of each numeric field's protobuf type.
FIELD_DTYPES: dict[str, str] = {
    "bool_contents": "bool",
    "int_contents": "int32",
    "int64_contents": "int64",
    "uint_contents": "uint32",
    "uint64_contents": "uint64",
    "fp32_contents": "float32",
    "fp64_contents": "float64",
}


def parse_request(message: ModelInferRequest, bounds: RequestBounds = UNBOUNDED) -> InferRequest:
    """The sidecar's request for a ModelInferRequest; BadRequest names what is wrong. Its
    declared items and bytes are checked against `bounds`, and each input's data against its
    shape, before any tensor data is converted."""
    if not message.inputs:
        raise BadRequest("'inputs' must not be empty")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; "
            "give it for every input or for none"
        )
    shapes = [_shape(tensor) for tensor in message.inputs]
    bounds.check_items(max(shape[0] for shape in shapes))
    bounds.check_bytes(
        sum(
            declared_bytes(tensor.datatype, shape, len(raw[index]) if raw else None)
            for index, (tensor, shape) in enumerate(zip(message.inputs, shapes, strict=True))
        )
    )
    inputs = [
        _input(tensor, shape, raw[index] if raw else None)
        for index, (tensor, shape) in enumerate(zip(message.inputs, shapes, strict=True))
    ]
    parameters = message.parameters
    outputs = [
        RequestedOutput(output.name, _flag(output.parameters, "binary_data", None))
        for output in message.outputs
    ]
    return InferRequest(
        inputs=inputs,
        id=message.id or None,
        outputs=outputs or None,
        binary_output=bool(_flag(parameters, "binary_data_output", True)),
        priority=_integer(parameters, "priority", 0),
        timeout_ms=_timeout(parameters),
    )


def _shape(tensor: ModelInferRequest.InferInputTensor) -> tuple[int, ...]:
    """The input's declared shape, once its datatype and shape are known good."""
    name = tensor.name
    if tensor.datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {tensor.datatype!r}")
    if len(tensor.shape) > MAX_DIMS:
        raise BadRequest(f"input {name!r}: 'shape' has more than {MAX_DIMS} dimensions")
    dims = tuple(tensor.shape)
    if not dims or any(dim < 0 for dim in dims):
        raise BadRequest(f"input {name!r}: 'shape' must be a non-empty list of counts")
    if dims[0] == 0:
        raise BadRequest(f"input {name!r}: the batch dimension must be at least 1")
    return dims


def _input(
    tensor: ModelInferRequest.InferInputTensor, dims: tuple[int, ...], raw: bytes | None
) -> RequestTensor:
    name = tensor.name
    datatype = tensor.datatype
    if raw is not None:
        return RequestTensor(
            name, datatype, dims, from_binary(name, datatype, dims, memoryview(raw))
        )
    return RequestTensor(name, datatype, dims, _typed(name, datatype, dims, tensor.contents))


def _typed(
    name: str, datatype: str, dims: tuple[int, ...], contents: InferTensorContents
) -> Array | list[bytes]:
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise BadRequest(f"input {name!r}: {datatype} data travels only in raw_input_contents")
    strays = [described.name for described, _ in contents.ListFields() if described.name != field]
    if strays:
        raise BadRequest(f"input {name!r}: {datatype} data belongs in {field}, not {strays}")
    values = getattr(contents, field)
    # Counted before converted: the conversion makes an object per element.
    check_count(name, dims, len(values))
    if datatype == BYTES:
        return list(values)
    # In the field's own type first (uint64 values above 2**63 would turn float), then
    # from_json checks the count and the range of narrower types, as for JSON data.
    return from_json(name, datatype, dims, np.asarray(values, dtype=FIELD_DTYPES[field]))


def _flag(parameters: Mapping[str, InferParameter], key: str, default: bool | None) -> bool | None:
    parameter = parameters.get(key)
    if parameter is None:
        return default
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise BadRequest(f"parameter {key!r} must be a bool_param")
    return parameter.bool_param


def _number(parameters: Mapping[str, InferParameter], key: str) -> int | float | None:
    parameter = parameters.get(key)
    if parameter is None:
        return None
    choice = parameter.WhichOneof("parameter_choice")
    if choice not in ("int64_param", "uint64_param", "double_param"):
        raise BadRequest(f"parameter {key!r} must be a number, got {choice}")
    value: int | float = getattr(parameter, choice)
    return value


def _integer(parameters: Mapping[str, InferParameter], key: str, default: int) -> int:
    value = _number(parameters, key)
    if value is None:
        return default
    if not isinstance(value, int):
        raise BadRequest(f"parameter {key!r} must be an integer, got {value!r}")
    return value


def _timeout(parameters: Mapping[str, InferParameter]) -> float | None:
    """`timeout` in milliseconds; clients send microseconds, as Triton takes them."""
    value = _number(parameters, "timeout")
    if value is None:
        return None
    if not value > 0:  # NaN too
        raise BadRequest(f"parameter 'timeout' must be microseconds > 0, got {value!r}")
    return value / 1000


def encode_response(response: InferResponse) -> ModelInferResponse:
    message = ModelInferResponse(
        model_name=response.model_name, model_version=MODEL_VERSION, id=response.id or ""
    )
    raw = bool(response.binary) or any(
        tensor.datatype not in CONTENTS_FIELDS for tensor in response.outputs
    )
    for tensor in response.outputs:
        output = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            message.raw_output_contents.append(bytes(binary_bytes(tensor)))
        else:
            values = tensor.data if isinstance(tensor.data, list) else tensor.data.tolist()
            getattr(output.contents, CONTENTS_FIELDS[tensor.datatype]).extend(values)
    return message
