"""Plain JSON values <-> wire items and results, typed by a handler's declared inputs.

A JSON record maps input names to values: a string (or a list of strings) for BYTES inputs,
a number or nested list of numbers for numeric ones. A bare string stands for the handler's
first input when that takes text (`text` of text-embedding, `text_input` of text-generation).
`{"file": PATH}` for a BYTES input is the file's bytes (an image for image-classification),
PATH relative to a base folder (`carpool infer`: its input file's), refused past the input's
`max_element_bytes` before it is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from carpool.contract import generation
from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import BYTES, NUMPY_DTYPES, Item, ItemResult, Tensor
from carpool_model_server.errors import InvalidItem

# A JSON record, or already-built tensors (from Python), or a bare string.
Record = Mapping[str, Any] | str
# Keys of a generate request that a record may not give unless the model takes them.
_SETTINGS = frozenset([*generation.SETTINGS, "parameters"])


def item_from_record(
    record: Record, inputs: Sequence[TensorSpec], base: Path | None = None
) -> Item:
    """The item for one record; raise InvalidItem when a value does not fit its input.
    Files are read relative to `base` (by default the working folder)."""
    if isinstance(record, str):
        if not inputs or inputs[0].datatype != BYTES:
            raise InvalidItem("a bare string stands for a first input of BYTES; give an object")
        record = {inputs[0].name: record}
    if not isinstance(record, Mapping):
        raise InvalidItem(f"a record must be an object of inputs, got {type(record).__name__}")
    specs = {spec.name: spec for spec in inputs}
    item: dict[str, Tensor] = {}
    for name, value in record.items():
        if value is None and name in _SETTINGS:
            continue  # not given, as /generate reads a null setting: the model's default
        spec = specs.get(name) or specs.get(generation.input_name(name))
        if spec is None:
            if name in _SETTINGS:
                raise InvalidItem(
                    f"{name!r} is no input of the model, which takes {list(specs)}: give "
                    f"settings beside the inputs, {generation.MAX_TOKENS!r} for "
                    f"{generation.MAX_NEW_TOKENS!r}"
                )
            continue  # not an input: ids and other fields the caller keeps for itself
        if spec.name in item:
            other = generation.setting_name(name) if name == spec.name else spec.name
            raise InvalidItem(f"input {spec.name!r} is given twice, as {name!r} and {other!r}")
        item[spec.name] = value if isinstance(value, Tensor) else _tensor(value, spec, base)
    return item


def files_size(
    record: Record, inputs: Sequence[TensorSpec], base: Path | None = None
) -> int | None:
    """The bytes of the files the record's `{"file": PATH}` values name (0 for one that
    cannot be read: reading it says why), or None when it names none."""
    if not isinstance(record, Mapping):
        return None
    byte_inputs = {spec.name for spec in inputs if spec.datatype == BYTES}
    names = [
        value.get("file")
        for name, value in record.items()
        if name in byte_inputs and isinstance(value, Mapping)
    ]
    if not names:
        return None
    sizes = 0
    for name in names:
        with contextlib.suppress(OSError):
            sizes += (base or Path.cwd()).joinpath(str(name)).stat().st_size
    return sizes


def _tensor(value: Any, spec: TensorSpec, base: Path | None) -> Tensor:
    if spec.datatype == BYTES and isinstance(value, Mapping):
        return Tensor(BYTES, (1,), [_file(value, spec, base or Path.cwd())])
    if spec.datatype == BYTES:
        strings = [value] if isinstance(value, str) else value
        if not (isinstance(strings, list) and all(isinstance(s, str) for s in strings)):
            raise InvalidItem(f"input {spec.name!r} takes a string or a list of strings")
        return Tensor(BYTES, (len(strings),), [s.encode() for s in strings])
    dtype = NUMPY_DTYPES.get(spec.datatype)
    if dtype is None or spec.datatype == "BF16":
        raise InvalidItem(f"input {spec.name!r} of {spec.datatype} has no JSON form")
    array = _numbers(value, spec, dtype)
    if array.ndim == 0 and len(spec.shape) == 1:
        array = array.reshape(1)  # a bare number for a one-element input
    return Tensor.from_numpy(array, spec.datatype)


def _file(value: Mapping[str, Any], spec: TensorSpec, base: Path) -> bytes:
    """The bytes of the file `{"file": PATH}` names, within the input's limit."""
    name = value.get("file")
    if set(value) != {"file"} or not isinstance(name, str):
        raise InvalidItem(f'input {spec.name!r} takes a string or {{"file": PATH}}')
    path = base / name
    limit = spec.max_element_bytes
    try:
        with path.open("rb") as file:
            data = file.read() if limit is None else file.read(limit + 1)
    except OSError as error:
        raise InvalidItem(f"input {spec.name!r}: cannot read {name}: {error.strerror}") from None
    if limit is not None and len(data) > limit:
        raise InvalidItem(
            f"input {spec.name!r}: {name} is over the model's limit of {limit} bytes "
            "(max_element_bytes)"
        )
    return data


def _numbers(value: Any, spec: TensorSpec, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """`value` as an array of `dtype`; InvalidItem for values of another kind or out of its
    range, which a cast would wrap around, make infinite or refuse with a traceback."""
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidItem(f"input {spec.name!r} must be {spec.datatype} numbers: {error}") from None
    shown = _shown(value)
    # Python integers past 64 bits make an array of objects.
    huge = raw.dtype.kind == "O" and all(type(v) is int for v in raw.flat)
    if raw.dtype.kind not in _KINDS[dtype.kind] and not (huge and dtype.kind in "iu"):
        raise InvalidItem(f"input {spec.name!r} takes {spec.datatype} numbers, got {shown}")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if huge or (raw.size and (raw.min() < info.min or raw.max() > info.max)):
            raise InvalidItem(f"input {spec.name!r}: {shown} is out of range for {spec.datatype}")
        return raw.astype(dtype)
    with np.errstate(over="ignore"):
        array = raw.astype(dtype)
    if (np.isfinite(raw) & ~np.isfinite(array)).any():
        raise InvalidItem(f"input {spec.name!r}: {shown} is out of range for {spec.datatype}")
    return array


# The array kinds a JSON value of each kind of datatype may come as.
_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
