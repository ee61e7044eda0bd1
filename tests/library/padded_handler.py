"""A fast handler that pads like a tokenizer does, for tests of length-sorted batching.

Each UTF-8 byte of `text` is a token; a batch pads to its longest text and carries an
`attention_mask`. The outputs depend on the text alone: `length` (its tokens) and `embedding`
(the masked mean of a fixed random table), so any mix-up of order shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.handler import Handler, Prepared, require_input, split_valid

TEXT = TensorSpec("text", BYTES, (1,))
LENGTH = TensorSpec("length", "INT64", (1,))
EMBEDDING = TensorSpec("embedding", "FP32", (8,))


@dataclass(frozen=True, slots=True)
class Bytes:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class PaddedBytesHandler(Handler[Bytes, torch.Tensor]):
    metadata = Metadata("carpool_test", (TEXT,), (LENGTH, EMBEDDING), pads_variable_dims=True)

    def load(self, device: torch.device) -> None:
        self.table = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))

    def preprocess(self, items: Sequence[Item]) -> Prepared[Bytes]:
        texts, rejected = split_valid(items, _bytes_of)
        width = max((len(text) for text in texts), default=0)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, text in enumerate(texts):
            ids[row, : len(text)] = np.frombuffer(text, dtype=np.uint8)
            mask[row, : len(text)] = 1
        batch = Bytes(torch.from_numpy(ids), torch.from_numpy(mask))
        return Prepared(batch if texts else None, len(texts), rejected)

    def infer(self, batch: Bytes) -> torch.Tensor:
        mask = batch.attention_mask.unsqueeze(-1).float()
        summed = (self.table[batch.input_ids] * mask).sum(dim=1)
        counts = mask.sum(dim=1)
        return torch.cat([counts, summed / counts.clamp(min=1)], dim=1)

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return [
            {
                LENGTH.name: Tensor.from_numpy(np.array([int(row[0])], dtype=np.int64)),
                EMBEDDING.name: Tensor.from_numpy(row[1:].numpy()),
            }
            for row in outputs
        ]


def _bytes_of(item: Item) -> bytes:
    data = require_input(item, TEXT).data
    assert isinstance(data, list)
    return data[0]
