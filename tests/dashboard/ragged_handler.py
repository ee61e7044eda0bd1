"""A toy model with variable-length input, so that the sidecar pads batches and the dashboard's
padding panel has data. Loaded by the model server as `ragged_handler:RaggedHandler` (with this
folder on PYTHONPATH): output = 2 * input + 1, each item as long as it came.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler import Handler, Prepared, require_input, split_valid

INPUT = TensorSpec("input", "FP32", (-1,))
OUTPUT = TensorSpec("output", "FP32", (-1,))

# The padded batch and each item's real length, so that outputs can be cut back.
Ragged = tuple[torch.Tensor, list[int]]


class RaggedHandler(Handler[Ragged, Ragged]):
    # The sidecar batches items of different lengths together only for a handler that pads.
    metadata = Metadata(
        platform="carpool_ragged", inputs=(INPUT,), outputs=(OUTPUT,), pads_variable_dims=True
    )

    def load(self, device: torch.device) -> None:
        self.device = device

    def preprocess(self, items: Sequence[Item]) -> Prepared[Ragged]:
        rows, rejected = split_valid(items, lambda item: require_input(item, INPUT).to_numpy())
        if not rows:
            return Prepared(None, 0, rejected)
        lengths = [len(row) for row in rows]
        padded = np.zeros((len(rows), max(lengths)), dtype=np.float32)
        for index, row in enumerate(rows):
            padded[index, : len(row)] = row
        return Prepared((torch.from_numpy(padded).to(self.device), lengths), len(rows), rejected)

    def infer(self, batch: Ragged) -> Ragged:
        values, lengths = batch
        return values * 2 + 1, lengths

    def postprocess(self, outputs: Ragged) -> list[dict[str, Tensor]]:
        values, lengths = outputs
        rows = values.cpu().numpy()
        return [
            {OUTPUT.name: Tensor.from_numpy(row[:length].copy())}
            for row, length in zip(rows, lengths, strict=True)
        ]

    def example_item(self) -> Item | None:
        return {INPUT.name: Tensor.from_numpy(np.zeros(4, dtype=np.float32))}
