"""Plain JSON values <-> wire items and results, typed by a handler's declared inputs.

A JSON record maps input names to values: a string (or a list of strings) for BYTES inputs,
a number or nested list of numbers for numeric ones. A bare string stands for the handler's
first input when that takes text (`text` of text-embedding, `text_input` of text-generation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import BYTES, NUMPY_DTYPES, Item, ItemResult, Tensor
from carpool_model_server.errors import InvalidItem

# A JSON record, or already-built tensors (from Python), or a bare string.
Record = Mapping[str, Any] | str


def item_from_record(record: Record, inputs: Sequence[TensorSpec]) -> Item:
    """The item for one record; raise InvalidItem when a value does not fit its input."""
    if isinstance(record, str):
        if not inputs or inputs[0].datatype != BYTES:
            raise InvalidItem("a bare string stands for a first input of BYTES; give an object")
        record = {inputs[0].name: record}
    if not isinstance(record, Mapping):
        raise InvalidItem(f"a record must be an object of inputs, got {type(record).__name__}")
    specs = {spec.name: spec for spec in inputs}
    item: dict[str, Tensor] = {}
    for name, value in record.items():
        spec = specs.get(name)
        if spec is None:
            continue  # not an input: ids and other fields the caller keeps for itself
        item[name] = value if isinstance(value, Tensor) else _tensor(value, spec)
    return item


def _tensor(value: Any, spec: TensorSpec) -> Tensor:
    if spec.datatype == BYTES:
        strings = [value] if isinstance(value, str) else value
        if not (isinstance(strings, list) and all(isinstance(s, str) for s in strings)):
            raise InvalidItem(f"input {spec.name!r} takes a string or a list of strings")
        return Tensor(BYTES, (len(strings),), [s.encode() for s in strings])
    dtype = NUMPY_DTYPES.get(spec.datatype)
    if dtype is None or spec.datatype == "BF16":
        raise InvalidItem(f"input {spec.name!r} of {spec.datatype} has no JSON form")
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise InvalidItem(f"input {spec.name!r} must be {spec.datatype} numbers: {error}") from None
    if array.ndim == 0 and len(spec.shape) == 1:
        array = array.reshape(1)  # a bare number for a one-element input
    return Tensor.from_numpy(array, spec.datatype)


def item_length(item: Item) -> int:
    """How long an item is, for sorting: bytes of text plus elements of numeric tensors."""
    total = 0
    for tensor in item.values():
        if isinstance(tensor.data, list):
            total += sum(len(element) for element in tensor.data)
        else:
            total += tensor.element_count
    return total


def result_to_json(result: ItemResult) -> dict[str, Any]:
    """A result as JSON: outputs by name (one string for a one-string output), or the error."""
    if result.error is not None:
        return {"error": result.error, "status": result.status}
    outputs: dict[str, Any] = {}
    for name, tensor in (result.outputs or {}).items():
        if isinstance(tensor.data, list):
            strings = [element.decode(errors="replace") for element in tensor.data]
            outputs[name] = strings[0] if tensor.shape == (1,) else strings
        else:
            outputs[name] = tensor.to_numpy().tolist()
    return {"outputs": outputs}
