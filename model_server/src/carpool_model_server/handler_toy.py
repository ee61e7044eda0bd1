"""`toy`: a tiny deterministic model for tests: output = 2 * input + 1.

Failure on purpose: an item holding NaN raises inside `infer` (a poison item the server must
isolate); an item with an infinite value, a wrong shape or a wrong datatype is refused by
`preprocess` as invalid.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.device import to_device
from carpool_model_server.handler import (
    Handler,
    Prepared,
    joined,
    output_rows,
    require_inputs,
)

WIDTH = 4
INPUT = TensorSpec("input", "FP32", (WIDTH,))
OUTPUT = TensorSpec("output", "FP32", (WIDTH,))


class PoisonError(RuntimeError):
    """The toy model's deliberate failure."""


class ToyHandler(Handler[torch.Tensor, torch.Tensor]):
    # No pipeline: its preprocess is too cheap to overlap, and the extra thread hop would
    # cost the model server CPU per batch (bench/hop.py).
    metadata = Metadata(platform="carpool_toy", inputs=(INPUT,), outputs=(OUTPUT,))

    def load(self, device: torch.device) -> None:
        self.device = device

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        tensors, rejected = require_inputs(items, INPUT)
        rows = joined(tensors.values(), INPUT.datatype).reshape(-1, WIDTH)
        infinite = np.isinf(rows).any(axis=1)
        if infinite.any():
            indices = list(tensors)
            for position in np.flatnonzero(infinite):
                rejected[indices[position]] = (
                    f"input {INPUT.name!r} must be finite, got {rows[position].tolist()}"
                )
            rows = rows[~infinite]
        batch = to_device(torch.from_numpy(rows), self.device) if len(rows) else None
        return Prepared(batch, len(rows), rejected)

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        if torch.isnan(batch).any():
            raise PoisonError("toy model refuses NaN")
        return batch * 2 + 1

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return output_rows(OUTPUT.name, outputs.cpu().numpy())

    def example_item(self) -> Item | None:
        return {INPUT.name: Tensor.from_numpy(np.zeros(WIDTH, dtype=np.float32))}
