"""Whole-request tensors and their conversions, all in numpy (no loops over elements).

A request tensor has the batch dimension first; `split` cuts it into per-item wire tensors
as memoryview slices of one buffer, `stack` joins the items' outputs back with one copy.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from carpool.contract.wire import BYTES, NUMPY_DTYPES, Tensor
from carpool.engine.errors import BadModelResponse, BadRequest

Array = npt.NDArray[Any]
_LENGTH = struct.Struct("<I")
# The most dimensions a numpy array has: a tensor with more cannot be converted.
MAX_DIMS = 64


@dataclass(frozen=True, slots=True)
class RequestTensor:
    """One named tensor of a request or response, batch dimension included.

    Numeric data is a flat array in the wire dtype (BF16 as uint16 words); BYTES data is a
    flat list of byte strings.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array | list[bytes]

    @property
    def items(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """The bytes of its data; BYTES elements as in the binary extension, with prefixes."""
        if isinstance(self.data, list):
            return sum(map(len, self.data)) + _LENGTH.size * len(self.data)
        return int(self.data.nbytes)


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> Array | list[bytes]:
    """Convert the `data` of a JSON tensor; BadRequest names the input on any mismatch."""
    if datatype == BYTES:
        try:
            flat = np.asarray(data, dtype=object).ravel()
        except (ValueError, TypeError) as error:
            raise BadRequest(f"input {name!r}: data is not a regular array: {error}") from error
        if not all(isinstance(element, str) for element in flat):
            raise BadRequest(f"input {name!r}: BYTES data must be strings")
        elements = [element.encode() for element in flat]
        check_count(name, shape, len(elements))
        return elements
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError) as error:
        raise BadRequest(f"input {name!r}: data is not a regular array: {error}") from error
    raw = raw.ravel()
    check_count(name, shape, raw.size)
    if datatype == "BF16":
        _require_kind(name, datatype, raw, "iuf")
        words = float32_to_bf16(_finite_cast(name, datatype, raw, np.dtype(np.float32)))
        # FP32's largest numbers round up past BF16's largest (3.3895e38): to its infinity.
        _finite(name, datatype, bf16_to_float32(words))
        return words
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind == "b":
        _require_kind(name, datatype, raw, "b")
    elif dtype.kind in "iu":
        if raw.dtype.kind in "fO":
            # Python ints beyond int64 turn a mixed list into float64 or objects.
            raw = _exact_integers(name, datatype, data, raw)
        _require_kind(name, datatype, raw, "iu")
        if raw.size:
            info = np.iinfo(dtype)
            if raw.min() < info.min or raw.max() > info.max:
                raise _out_of_range(name, datatype)
    else:
        _require_kind(name, datatype, raw, "iuf")
        return _finite_cast(name, datatype, raw, dtype)
    return raw.astype(dtype, copy=False)


def _finite_cast(name: str, datatype: str, raw: Array, dtype: np.dtype[Any]) -> Array:
    """`raw` as floats of `dtype`; BadRequest for a number past its range, which the cast
    would make infinite (JSON holds finite numbers only)."""
    with np.errstate(over="ignore"):
        return _finite(name, datatype, raw.astype(dtype, copy=False))


def _finite(name: str, datatype: str, values: Array) -> Array:
    if not np.isfinite(values).all():
        raise _out_of_range(name, datatype)
    return values


def _out_of_range(name: str, datatype: str) -> BadRequest:
    """A value of `name` that its datatype cannot hold: an integer past its bounds, a number
    past a float type's largest."""
    return BadRequest(f"input {name!r}: values out of range for {datatype}")


def from_binary(
    name: str, datatype: str, shape: tuple[int, ...], raw: memoryview
) -> Array | list[bytes]:
    """Read a tensor of the binary data extension; numeric data is not copied."""
    if datatype == BYTES:
        elements = parse_length_prefixed(name, raw, element_count(shape))
        check_count(name, shape, len(elements))
        return elements
    dtype = NUMPY_DTYPES[datatype]
    if len(raw) % dtype.itemsize:
        raise BadRequest(
            f"input {name!r}: {len(raw)} bytes is not a whole number of {datatype} elements"
        )
    array = np.frombuffer(raw, dtype=dtype)
    check_count(name, shape, array.size)
    return array


def parse_length_prefixed(name: str, raw: memoryview, most: int) -> list[bytes]:
    """BYTES in the binary extension: each element is a 4-byte little-endian length, then data.
    At most `most` elements are read: BadRequest once the data holds more."""
    elements: list[bytes] = []
    offset = 0
    end = len(raw)
    while offset < end:
        if len(elements) == most:
            raise BadRequest(f"input {name!r}: more than the {most} elements its shape holds")
        if offset + 4 > end:
            raise BadRequest(f"input {name!r}: truncated BYTES length prefix")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise BadRequest(f"input {name!r}: BYTES element runs past the data")
        elements.append(bytes(raw[offset : offset + length]))
        offset += length
    return elements


def length_prefixed(elements: Sequence[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(element)) + element for element in elements)


def float32_to_bf16(values: Array) -> Array:
    """Round float32 to the nearest bfloat16 (ties to even), as uint16 words."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_to_float32(words: Array) -> Array:
    return (words.astype(np.uint32) << np.uint32(16)).view(np.float32)


def json_values(tensor: RequestTensor) -> Array | list[str]:
    """Flat data for a JSON response; orjson serializes numpy arrays natively."""
    if isinstance(tensor.data, list):
        return [element.decode(errors="replace") for element in tensor.data]
    if tensor.datatype == "BF16":
        return bf16_to_float32(tensor.data)
    if tensor.datatype == "FP16":
        return tensor.data.astype(np.float32)
    return tensor.data


def binary_bytes(tensor: RequestTensor) -> bytes | memoryview:
    if isinstance(tensor.data, list):
        return length_prefixed(tensor.data)
    return np.ascontiguousarray(tensor.data).data.cast("B")


def split(tensor: RequestTensor, start: int = 0, stop: int | None = None) -> list[Tensor]:
    """Per-item wire tensors of items `start` to `stop` (all by default); numeric items are
    memoryview slices of the request buffer."""
    count = tensor.items
    stop = count if stop is None else stop
    item_shape = tensor.shape[1:]
    if isinstance(tensor.data, list):
        per_item = element_count(item_shape)
        return [
            Tensor(BYTES, item_shape, tensor.data[index * per_item : (index + 1) * per_item])
            for index in range(start, stop)
        ]
    view = np.ascontiguousarray(tensor.data).data.cast("B")
    stride = len(view) // count if count else 0
    # msgpack packs any buffer as bin; the slices avoid one copy per item.
    return [
        Tensor(tensor.datatype, item_shape, view[index * stride : (index + 1) * stride])
        for index in range(start, stop)
    ]


def stack(name: str, parts: Sequence[Tensor]) -> RequestTensor:
    """Join one output of every item of a request, batch dimension first."""
    first = parts[0]
    for part in parts:
        if part.shape != first.shape or part.datatype != first.datatype:
            raise BadModelResponse(
                f"output {name!r} differs between items: {first.datatype}{list(first.shape)} "
                f"and {part.datatype}{list(part.shape)}"
            )
    shape = (len(parts), *first.shape)
    if first.datatype == BYTES:
        elements = [element for part in parts for element in cast(list[bytes], part.data)]
        return RequestTensor(name, BYTES, shape, elements)
    joined = b"".join(cast(bytes, part.data) for part in parts)
    return RequestTensor(
        name, first.datatype, shape, np.frombuffer(joined, NUMPY_DTYPES[first.datatype])
    )


def check_count(name: str, shape: Sequence[int], have: int) -> None:
    want = element_count(shape)
    if have != want:
        raise BadRequest(f"input {name!r}: shape {list(shape)} needs {want} elements, got {have}")


def _exact_integers(name: str, datatype: str, data: Any, raw: Array) -> Array:
    """`data` converted exactly when it holds only integers that numpy typed as float64 or
    objects (a mix of values below and above 2**63); else `raw` as it was, for
    `_require_kind` to refuse."""
    values = np.asarray(data, dtype=object).ravel()
    if not all(type(value) is int for value in values):
        return raw
    try:
        return np.array(values.tolist(), dtype=NUMPY_DTYPES[datatype])
    except OverflowError as error:
        raise _out_of_range(name, datatype) from error


def _require_kind(name: str, datatype: str, raw: Array, kinds: str) -> None:
    if raw.size and raw.dtype.kind not in kinds:
        raise BadRequest(f"input {name!r}: data of kind {raw.dtype} does not fit {datatype}")
