"""KServe v1 `:predict` bodies, mapped onto the model's single input.

`{"instances": [i0, i1, ...]}`: each instance is one item of the model's only input, so
the instances stacked give that input with the batch dimension first. A scalar instance
(a number or a string) fills an input whose per-item shape is [1]. The answer is
`{"predictions": [p0, p1, ...]}`: with one output each prediction is that output of one
item; with several, each is an object mapping output names to values.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import orjson

from carpool.contract.metadata import ModelMetadata
from carpool.contract.wire import BYTES, NUMPY_DTYPES
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import BadRequest
from carpool_sidecar import counting
from carpool_sidecar.bounds import declared_bytes
from carpool_sidecar.inference import InferRequest, InferResponse
from carpool_sidecar.oip import decode, loads
from carpool_sidecar.tensors import RequestTensor, element_count, from_json, json_values

# BF16 travels as uint16 words but is given as floats.
INTEGER_DATATYPES = frozenset(
    name for name, dtype in NUMPY_DTYPES.items() if dtype.kind in "iu" and name != "BF16"
)


class _Body(msgspec.Struct):
    # Kept as text: counted against the model's input and the bounds before it is converted.
    instances: msgspec.Raw = msgspec.Raw()


def parse_request(
    body: bytes | bytearray, metadata: ModelMetadata, bounds: RequestBounds
) -> InferRequest:
    """The request in `body`. v1 declares no shape, so its instances, elements and arrays
    are counted from the text and checked against the model's one input and `bounds`
    before the instances are converted."""
    text = bytes(decode(body, _Body).instances)
    if len(metadata.inputs) != 1:
        raise BadRequest(
            f"v1 predict needs a model with one input; this one takes {len(metadata.inputs)}"
        )
    spec = metadata.inputs[0]
    strings = spec.datatype == BYTES
    if not text.startswith(b"[") or not (items := counting.outer(text, strings)):
        raise BadRequest("body must be an object with a non-empty 'instances' list")
    bounds.check_items(items)
    scalars, arrays = counting.elements(spec.name, spec.datatype, text, len(text), strings)
    bounds.check_bytes(declared_bytes(spec.datatype, (scalars,), None))
    if not spec.variable and scalars != items * element_count(spec.shape):
        raise BadRequest(
            f"input {spec.name!r}: {items} instances of shape {list(spec.shape)} hold "
            f"{items * element_count(spec.shape)} elements, got {scalars}"
        )
    # Each instance an array, each of its rows one, each scalar wrapped at most once.
    room = 1 + items + len(spec.shape) * scalars
    if arrays > room:
        raise BadRequest(
            f"instances hold {arrays} arrays, more than {items} instances of {scalars} "
            f"elements in all have room for ({room})"
        )
    instances = loads(text)
    try:
        # Converted once: from_json takes the array as it is.
        array = np.asarray(instances, dtype=object if spec.datatype == BYTES else None)
        if array.dtype.kind == "f" and spec.datatype in INTEGER_DATATYPES:
            # Exact integers across the whole range: from_json checks them one by one.
            array = np.asarray(instances, dtype=object)
    except (ValueError, TypeError) as error:
        raise BadRequest(f"instances are not a regular array: {error}") from error
    shape = array.shape
    if len(shape) == 1 and spec.shape == (1,):
        shape = (shape[0], 1)
    data = from_json(spec.name, spec.datatype, shape, array)
    return InferRequest(inputs=[RequestTensor(spec.name, spec.datatype, shape, data)])


def encode_response(response: InferResponse) -> bytes:
    columns = [_nested(tensor) for tensor in response.outputs]
    predictions: Any
    if len(columns) == 1:
        predictions = columns[0]
    else:
        names = [tensor.name for tensor in response.outputs]
        predictions = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    return orjson.dumps({"predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY)


def _nested(tensor: RequestTensor) -> Any:
    values = json_values(tensor)
    if isinstance(values, list):
        return np.asarray(values, dtype=object).reshape(tensor.shape).tolist()
    return values.reshape(tensor.shape)
