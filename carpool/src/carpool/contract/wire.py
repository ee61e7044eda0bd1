"""The binary wire format between the sidecar and the model server.

One msgpack document per batch, in a frame (frames.py) or an HTTP body; tensors travel as
raw little-endian buffers, never as JSON numbers. Both sides import this module, so the
format has exactly one definition. `docs/wire-format.md` describes it for implementers in
other languages.

Request:                 {"items": [{"inputs": {name: tensor}}, ...]}
Response (200):          {"results": [{"outputs": {name: tensor}} | {"error": str, "status": int}],
                          "queued_s": float, "worker_s": float}   (both optional)
Tensor:                  {"datatype": str, "shape": [int, ...], "data": bytes | [bytes, ...]}

An item is one sample: its tensors have no batch dimension. Results come back in the order
of the items, one each; an item's error carries the HTTP status its caller should see. The
model server says where the batch's time went (`BatchTiming`): the sidecar's timed dispatch
learns from it when the model will be free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt

CONTENT_TYPE = "application/vnd.carpool.batch+msgpack"
# The largest body either side reads, over HTTP or in a frame: a max-size batch of sizeable
# tensors (aiohttp's default limit is 1 MiB).
MAX_BODY_BYTES = 256 * 1024 * 1024

# Open Inference Protocol datatype -> numpy dtype of its little-endian buffer.
# BF16 has no numpy dtype: its buffer travels as raw 16-bit words, read as uint16.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}
BYTES = "BYTES"
DATATYPES = frozenset([*NUMPY_DTYPES, BYTES])
_BUFFERS = (bytes, bytearray, memoryview)
# The other way, for `datatype_of` (once per output tensor): BF16's words read as UINT16.
_DATATYPE_OF = {dtype: name for name, dtype in NUMPY_DTYPES.items() if name != "BF16"}


class WireError(ValueError):
    """A body that does not follow the wire format."""


class Tensor(NamedTuple):
    """One named input or output of one item, without its batch dimension."""

    # A named tuple, not a dataclass: a batch builds one per item and input, and a tuple is
    # built in a third of a frozen dataclass's time.
    datatype: str
    shape: tuple[int, ...]
    # Raw little-endian buffer for numeric datatypes; one element per entry for BYTES.
    data: bytes | memoryview | list[bytes]

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    def check(self) -> None:
        """Raise WireError when the data does not hold exactly `shape` elements."""
        # Once per tensor of every item decoded: written for speed (no generators).
        if self.datatype not in DATATYPES:
            raise WireError(f"unknown datatype {self.datatype!r}")
        if self.shape and min(self.shape) < 0:
            raise WireError(f"negative dimension in shape {list(self.shape)}")
        if self.datatype == BYTES:
            if not isinstance(self.data, list) or not all(
                isinstance(element, bytes) for element in self.data
            ):
                raise WireError("BYTES data must be a list of byte strings")
            have = len(self.data)
        else:
            if not isinstance(self.data, _BUFFERS):
                raise WireError(f"{self.datatype} data must be a byte buffer")
            itemsize = NUMPY_DTYPES[self.datatype].itemsize
            if len(self.data) % itemsize:
                raise WireError(
                    f"{self.datatype} buffer of {len(self.data)} bytes is not a whole "
                    f"number of {itemsize}-byte elements"
                )
            have = len(self.data) // itemsize
        if have != self.element_count:
            raise WireError(
                f"shape {list(self.shape)} needs {self.element_count} elements, data has {have}"
            )

    def to_numpy(self) -> npt.NDArray[Any]:
        """A read-only view of a numeric tensor (BF16 as uint16 words); BYTES as an object array."""
        if self.datatype == BYTES:
            array = np.empty(len(self.data), dtype=object)
            array[:] = self.data
            return array.reshape(self.shape)
        assert not isinstance(self.data, list)
        return np.frombuffer(self.data, dtype=NUMPY_DTYPES[self.datatype]).reshape(self.shape)

    @classmethod
    def from_numpy(cls, array: npt.NDArray[Any], datatype: str | None = None) -> Tensor:
        """Wrap an array; `datatype` is needed only for BF16 words and object (BYTES) arrays."""
        if datatype is None:
            datatype = datatype_of(array.dtype)
        shape = array.shape
        if datatype == BYTES:
            elements = [e if isinstance(e, bytes) else str(e).encode() for e in array.flat]
            return cls(BYTES, shape, elements)
        wanted = NUMPY_DTYPES[datatype]
        return cls(datatype, shape, np.ascontiguousarray(array, dtype=wanted).tobytes())


class ItemResult(NamedTuple):
    """The model server's answer for one item: outputs, or an error with its HTTP status."""

    outputs: Mapping[str, Tensor] | None = None
    error: str | None = None
    status: int = 200

    @classmethod
    def failed(cls, message: str, status: int) -> ItemResult:
        return cls(error=message, status=status)


def known_tensor(
    datatype: str, shape: tuple[int, ...], data: bytes | memoryview | list[bytes]
) -> Tensor:
    """A tensor whose fields are known good, built without the named tuple's own `__new__`
    (Python code): a batch builds one per item."""
    return tuple.__new__(Tensor, (datatype, shape, data))


def answered(outputs: Mapping[str, Tensor]) -> ItemResult:
    """An item's outputs as its result, built without the named tuple's own `__new__`
    (Python code): a batch builds one per item."""
    return tuple.__new__(ItemResult, (outputs, None, 200))


Item = Mapping[str, Tensor]


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """The model server's account of one batch."""

    # From its arrival until the worker started it: preprocessing ahead of the worker, or
    # the batch before it still running.
    queued_s: float
    # The worker's own time on it: the forward pass and whatever it did around it.
    worker_s: float


def datatype_of(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "OSU":
        return BYTES
    name = _DATATYPE_OF.get(dtype.newbyteorder("<"))
    if name is None:
        raise WireError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")
    return name


def _pack_tensor(tensor: Tensor) -> dict[str, Any]:
    # msgpack writes a tuple as an array: the shape needs no list.
    return {"datatype": tensor.datatype, "shape": tensor.shape, "data": tensor.data}


_Checked = dict[tuple[Any, ...], tuple[int, ...]]


def _unpack_tensor(raw: Any) -> Tensor:
    try:
        data, shape = raw["data"], raw["shape"]
        # Bodies are read with arrays as tuples (hashable, so shapes key `_Checked`).
        if type(shape) is not tuple:
            raise TypeError(f"shape must be a list of integers, got {shape!r:.50}")
        tensor = Tensor(
            str(raw["datatype"]),
            tuple(map(int, shape)),
            list(data) if type(data) is tuple else data,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise WireError(f"malformed tensor: {error}") from error
    tensor.check()
    return tensor


def _unpack_failure(raw: dict[Any, Any]) -> ItemResult:
    message, status = raw["error"], raw.get("status", 500)
    if not isinstance(message, str):
        raise WireError(f"an item's error must be a string, got {type(message).__name__}")
    if not isinstance(status, int) or isinstance(status, bool):
        raise WireError(f"an item's status must be an integer, got {status!r:.50}")
    return ItemResult.failed(message, status)


def _unpack_tensors(raw: Any, checked: _Checked) -> dict[str, Tensor]:
    """The tensors of one item. `checked` holds the shapes of the buffers this body's
    tensors passed `Tensor.check` with, by datatype, length and shape as they came: the
    items of a batch mostly share them, and are not checked again."""
    if type(raw) is not dict:
        raise WireError("tensors must be a map of name to tensor")
    tensors = {}
    for name, value in raw.items():
        try:
            data, datatype = value["data"], value["datatype"]
            # A KeyError for a new kind, a TypeError for one that cannot be (unhashable).
            shape = checked[datatype, len(data), value["shape"]] if type(data) is bytes else None
        except (KeyError, TypeError):
            shape = None
        if shape is not None:
            tensor = known_tensor(datatype, shape, data)
        else:
            tensor = _unpack_tensor(value)
            if type(tensor.data) is bytes:  # later tensors whose shape equals it hit
                checked[tensor.datatype, len(tensor.data), tensor.shape] = tensor.shape
        tensors[name if type(name) is str else str(name)] = tensor
    return tensors


def _loads(body: bytes, key: str) -> tuple[dict[Any, Any], tuple[Any, ...]]:
    """The document and its array under `key`."""
    try:
        document = msgpack.unpackb(body, raw=False, use_list=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise WireError(f"body is not msgpack: {error}") from error
    entries = document.get(key) if type(document) is dict else None
    if type(entries) is not tuple:
        raise WireError(f"body must be a map with a list under {key!r}")
    return document, entries


def encode_request(items: Sequence[Item]) -> bytes:
    packed = [{"inputs": {name: _pack_tensor(t) for name, t in item.items()}} for item in items]
    return msgpack.packb({"items": packed}, use_bin_type=True)


def decode_request(body: bytes) -> list[dict[str, Tensor]]:
    items = []
    checked: _Checked = {}
    for raw in _loads(body, "items")[1]:
        if type(raw) is not dict:
            raise WireError("each item must be a map with an 'inputs' map")
        items.append(_unpack_tensors(raw.get("inputs"), checked))
    return items


def encode_response(results: Sequence[ItemResult], timing: BatchTiming | None = None) -> bytes:
    packed: list[dict[str, Any]] = []
    for outputs, error, status in results:
        if error is not None:
            packed.append({"error": error, "status": status})
        else:
            packed.append(
                {"outputs": {name: _pack_tensor(t) for name, t in (outputs or {}).items()}}
            )
    document: dict[str, Any] = {"results": packed}
    if timing is not None:
        document["queued_s"], document["worker_s"] = timing.queued_s, timing.worker_s
    return msgpack.packb(document, use_bin_type=True)


def decode_response(body: bytes) -> list[ItemResult]:
    return decode_answer(body)[0]


def decode_answer(body: bytes) -> tuple[list[ItemResult], BatchTiming | None]:
    """The results, and the model server's timing when it gave one."""
    document, entries = _loads(body, "results")
    results = []
    checked: _Checked = {}
    for raw in entries:
        if type(raw) is not dict:
            raise WireError("each result must be a map")
        if "error" in raw:
            results.append(_unpack_failure(raw))
        else:
            results.append(answered(_unpack_tensors(raw.get("outputs"), checked)))
    queued, worker = document.get("queued_s"), document.get("worker_s")
    if not (isinstance(queued, float) and isinstance(worker, float)):
        return results, None
    return results, BatchTiming(queued, worker)
