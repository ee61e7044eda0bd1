"""What the sidecar knows of its model, read from the model server's `GET /metadata`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from carpool.model_server.wire import DATATYPES
from carpool.sidecar.errors import BadModelResponse


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output; `shape` is per item (no batch dimension), -1 for variable."""

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
class ModelMetadata:
    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    # The handler pads items that differ in variable dimensions (see length buckets).
    pads_variable_dims: bool = False

    @classmethod
    def parse(cls, document: Any) -> ModelMetadata:
        try:
            return cls(
                name=str(document["name"]),
                platform=str(document["platform"]),
                inputs=tuple(_spec(raw) for raw in document["inputs"]),
                outputs=tuple(_spec(raw) for raw in document["outputs"]),
                max_batch_size=int(document["max_batch_size"]),
                pads_variable_dims=_flag(document.get("pads_variable_dims", False)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise BadModelResponse(f"model server metadata is malformed: {error!r}") from error

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)


def _flag(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"pads_variable_dims must be true or false, got {raw!r}")
    return raw


def _spec(raw: Any) -> TensorSpec:
    datatype = str(raw["datatype"])
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    return TensorSpec(str(raw["name"]), datatype, tuple(int(dim) for dim in raw["shape"]))
