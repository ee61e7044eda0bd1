"""The model metadata document: what the model server's `GET /metadata` says of its model.

A handler declares the model's part (`Metadata`); the server adds its name and batch limit
(`ModelMetadata`) and encodes that; the sidecar decodes it. Both directions live here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from carpool.contract.wire import BYTES, DATATYPES


class MetadataError(ValueError):
    """A metadata document that does not follow this format."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: per-item shape without the batch dimension, -1 for variable.

    An input may bound what one item costs the model: `max_elements` caps the elements of
    one item (for variable dimensions), `max_element_bytes` the length of each BYTES
    element; `minimum` and `maximum` bound the value of each element of a numeric input
    (inclusive), to what the model can compute with. The sidecar refuses a request that
    exceeds any of them (400) before it queues it; the model server refuses such an item too.

    The sidecar batches items that vary in length by their length (the bytes of BYTES
    elements, the variable dimensions of padded numbers), as a handler pads texts to the
    longest of its batch; `batch_by_length=False` says an item costs the model alike whatever
    its length (an image, resized in preprocess): items of any length then share a batch.
    An `optional` input may be left out of a request (the handler has a default for it).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    max_elements: int | None = None
    max_element_bytes: int | None = None
    minimum: float | None = None
    maximum: float | None = None
    batch_by_length: bool = True
    optional: bool = False

    @property
    def variable(self) -> bool:
        return -1 in self.shape

    def limit_error(self, item_shape: Sequence[int], elements: object) -> str | None:
        """Why an item of `item_shape` is over this input's limits, None when within them.

        `elements`: the elements of the item or of a whole request: a list of bytes (BYTES)
        or an array in the wire dtype (numbers; BF16 as uint16 words).
        """
        if self.max_elements is not None and math.prod(item_shape) > self.max_elements:
            return (
                f"input {self.name!r}: {math.prod(item_shape)} elements in one item, over the "
                f"model's limit of {self.max_elements} (max_elements)"
            )
        if isinstance(elements, np.ndarray):
            return self._range_error(elements)
        if self.max_element_bytes is None or not isinstance(elements, list):
            return None
        longest = max(map(len, elements), default=0)
        if longest > self.max_element_bytes:
            return (
                f"input {self.name!r}: an element of {longest} bytes, over the model's "
                f"limit of {self.max_element_bytes} bytes per element (max_element_bytes)"
            )
        return None

    def _range_error(self, elements: npt.NDArray[Any]) -> str | None:
        if (self.minimum is None and self.maximum is None) or not elements.size:
            return None
        values = _numbers(elements, self.datatype)
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        outside = values[~((values >= low) & (values <= high))]  # NaN is outside too
        if not outside.size:
            return None
        return (
            f"input {self.name!r}: value {outside[0].item()!r} is outside the model's range "
            f"[{_number(low)}, {_number(high)}] (minimum, maximum)"
        )

    def as_v2(self) -> dict[str, Any]:
        """Open Inference Protocol form: the batch dimension prepended as -1."""
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


@dataclass(frozen=True, slots=True)
class Metadata:
    """What a handler declares of its model."""

    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # True when `preprocess` pads items that differ in a variable dimension to one batch.
    # The sidecar then batches such items together, grouped by length; otherwise it batches
    # only numeric items of identical shape.
    pads_variable_dims: bool = False
    # True when the model server batches generation itself, token by token, and answers a
    # stream frame (`frames.STREAM`) with the tokens as they come: the sidecar then sends
    # each generate request on its own, without waiting for company.
    streams_tokens: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMetadata(Metadata):
    """The whole document: the handler's declaration, the served name and the batch limit."""

    name: str
    max_batch_size: int

    @classmethod
    def served(cls, declared: Metadata, name: str, max_batch_size: int) -> ModelMetadata:
        return cls(
            platform=declared.platform,
            inputs=declared.inputs,
            outputs=declared.outputs,
            pads_variable_dims=declared.pads_variable_dims,
            streams_tokens=declared.streams_tokens,
            name=name,
            max_batch_size=max_batch_size,
        )

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)

    def encode(self) -> dict[str, Any]:
        """The JSON document, Open Inference Protocol style plus the max batch size."""
        return {
            "name": self.name,
            "platform": self.platform,
            "inputs": [_encode_spec(spec) for spec in self.inputs],
            "outputs": [_encode_spec(spec) for spec in self.outputs],
            "max_batch_size": self.max_batch_size,
            "pads_variable_dims": self.pads_variable_dims,
            "streams_tokens": self.streams_tokens,
        }

    @classmethod
    def decode(cls, document: Any) -> ModelMetadata:
        """Read a decoded JSON document; MetadataError names what is wrong."""
        try:
            return cls(
                name=str(document["name"]),
                platform=str(document["platform"]),
                inputs=tuple(_decode_spec(raw) for raw in document["inputs"]),
                outputs=tuple(_decode_spec(raw) for raw in document["outputs"]),
                max_batch_size=int(document["max_batch_size"]),
                pads_variable_dims=_flag(document, "pads_variable_dims", False),
                streams_tokens=_flag(document, "streams_tokens", False),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise MetadataError(f"model server metadata is malformed: {error!r}") from error


# The optional per-item limits of an input, as named in the document.
LIMITS = ("max_elements", "max_element_bytes")
# The optional bounds of an input's values, as named in the document.
BOUNDS = ("minimum", "maximum")


def _numbers(elements: npt.NDArray[Any], datatype: str) -> npt.NDArray[Any]:
    """Elements as numbers: BF16 words widened to the float32 they are the top half of."""
    if datatype == "BF16":
        return (elements.astype(np.uint32) << 16).view(np.float32)
    return elements


def _number(value: float) -> str:
    """A bound as a message writes it: 1, not 1.0."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _encode_spec(spec: TensorSpec) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": spec.name,
        "datatype": spec.datatype,
        "shape": list(spec.shape),
    }
    for limit in (*LIMITS, *BOUNDS):
        if (value := getattr(spec, limit)) is not None:
            document[limit] = value
    if not spec.batch_by_length:
        document["batch_by_length"] = False
    if spec.optional:
        document["optional"] = True
    return document


def _decode_spec(raw: Any) -> TensorSpec:
    datatype = str(raw["datatype"])
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    limits: dict[str, Any] = {limit: _limit(limit, raw[limit]) for limit in LIMITS if limit in raw}
    limits |= {bound: _bound(bound, raw[bound]) for bound in BOUNDS if bound in raw}
    if datatype == BYTES and set(limits) & set(BOUNDS):
        raise ValueError(f"a BYTES input has no {' or '.join(BOUNDS)}")
    shape = tuple(int(dim) for dim in raw["shape"])
    by_length = _flag(raw, "batch_by_length", True)
    optional = _flag(raw, "optional", False)
    return TensorSpec(
        str(raw["name"]), datatype, shape, **limits, batch_by_length=by_length, optional=optional
    )


def _limit(name: str, raw: Any) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return raw


def _bound(name: str, raw: Any) -> float:
    if not isinstance(raw, int | float) or isinstance(raw, bool) or not math.isfinite(raw):
        raise ValueError(f"{name} must be a finite number, got {raw!r}")
    return raw


def _flag(document: Any, name: str, default: bool) -> bool:
    """An optional flag of the document, `default` when absent (older model servers)."""
    raw = document.get(name, default)
    if not isinstance(raw, bool):
        raise ValueError(f"{name} must be true or false, got {raw!r}")
    return raw
