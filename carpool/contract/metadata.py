"""The model metadata document: what the model server's `GET /metadata` says of its model.

A handler declares the model's part (`Metadata`); the server adds its name and batch limit
(`ModelMetadata`) and encodes that; the sidecar decodes it. Both directions live here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carpool.contract.wire import DATATYPES


class MetadataError(ValueError):
    """A metadata document that does not follow this format."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: per-item shape without the batch dimension, -1 for variable."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def variable(self) -> bool:
        return -1 in self.shape

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
                pads_variable_dims=_flag(document.get("pads_variable_dims", False)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise MetadataError(f"model server metadata is malformed: {error!r}") from error


def _encode_spec(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def _decode_spec(raw: Any) -> TensorSpec:
    datatype = str(raw["datatype"])
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    return TensorSpec(str(raw["name"]), datatype, tuple(int(dim) for dim in raw["shape"]))


def _flag(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"pads_variable_dims must be true or false, got {raw!r}")
    return raw
