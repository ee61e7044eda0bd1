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
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import Handler, Prepared, require_input, split_valid

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
        rows, rejected = split_valid(items, _check)
        batch = to_device(torch.from_numpy(np.stack(rows)), self.device) if rows else None
        return Prepared(batch, len(rows), rejected)

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        if torch.isnan(batch).any():
            raise PoisonError("toy model refuses NaN")
        return batch * 2 + 1

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return [{OUTPUT.name: Tensor.from_numpy(row)} for row in outputs.cpu().numpy()]

    def example_item(self) -> Item | None:
        return {INPUT.name: Tensor.from_numpy(np.zeros(WIDTH, dtype=np.float32))}


def _check(item: Item) -> np.ndarray:
    row = require_input(item, INPUT).to_numpy()
    if np.isinf(row).any():
        raise InvalidItem(f"input {INPUT.name!r} must be finite, got {row.tolist()}")
    return row
