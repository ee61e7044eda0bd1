"""A model with one input per Open Inference Protocol datatype, for protocol tests.

Input `in_<type>` (3 elements per item) comes back as output `out_<type>` with its elements
in reverse order: proof the model saw the values, and exact in every datatype. The
datatypes it takes are those of CARPOOL_TEST_DATATYPES (comma-separated; default all).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from carpool.contract.wire import BYTES, DATATYPES, NUMPY_DTYPES, Item, Tensor
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Metadata,
    Prepared,
    TensorSpec,
    require_input,
    split_valid,
)

WIDTH = 3
ALL_DATATYPES = (*NUMPY_DTYPES, BYTES)
assert set(ALL_DATATYPES) == DATATYPES


def input_name(datatype: str) -> str:
    return f"in_{datatype.lower()}"


def output_name(datatype: str) -> str:
    return f"out_{datatype.lower()}"


class EveryTypeHandler(Handler[list[Item], list[Item]]):
    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        chosen = os.environ.get("CARPOOL_TEST_DATATYPES", ",".join(ALL_DATATYPES)).split(",")
        self.metadata = Metadata(
            platform="carpool_every_type",
            inputs=tuple(TensorSpec(input_name(kind), kind, (WIDTH,)) for kind in chosen),
            outputs=tuple(TensorSpec(output_name(kind), kind, (WIDTH,)) for kind in chosen),
        )

    def load(self, device: torch.device) -> None:
        pass  # no weights

    def preprocess(self, items: Sequence[Item]) -> Prepared[list[Item]]:
        valid, rejected = split_valid(items, self._check)
        return Prepared(valid or None, len(valid), rejected)

    def infer(self, batch: list[Item]) -> list[Item]:
        specs = self.metadata.inputs
        return [
            {output_name(spec.datatype): _reversed(item[spec.name]) for spec in specs}
            for item in batch
        ]

    def postprocess(self, outputs: list[Item]) -> list[dict[str, Tensor]]:
        return [dict(item) for item in outputs]

    def _check(self, item: Item) -> Item:
        for spec in self.metadata.inputs:
            require_input(item, spec)
        if len(item) != len(self.metadata.inputs):
            raise InvalidItem(f"unexpected inputs in {sorted(item)}")
        return item


def _reversed(tensor: Tensor) -> Tensor:
    if tensor.datatype == BYTES:
        assert isinstance(tensor.data, list)
        return Tensor(BYTES, tensor.shape, tensor.data[::-1])
    return Tensor(tensor.datatype, tensor.shape, tensor.to_numpy()[::-1].tobytes())
