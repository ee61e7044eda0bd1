"""A model with BYTES in and out, cheap enough for protocol tests: it upper-cases its text."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import Handler, Prepared, split_valid

TEXT = TensorSpec("text", BYTES, (1,))
SHOUT = TensorSpec("shout", BYTES, (1,))


class ShoutHandler(Handler[list[bytes], list[bytes]]):
    metadata = Metadata(platform="carpool_shout", inputs=(TEXT,), outputs=(SHOUT,))

    def load(self, device: torch.device) -> None:
        pass  # no weights

    def preprocess(self, items: Sequence[Item]) -> Prepared[list[bytes]]:
        texts, rejected = split_valid(items, _text_of)
        return Prepared(texts or None, len(texts), rejected)

    def infer(self, batch: list[bytes]) -> list[bytes]:
        return [text.upper() for text in batch]

    def postprocess(self, outputs: list[bytes]) -> list[dict[str, Tensor]]:
        return [{SHOUT.name: Tensor(BYTES, (1,), [text])} for text in outputs]


def _text_of(item: Item) -> bytes:
    tensor = item.get(TEXT.name)
    if tensor is None or not isinstance(tensor.data, list) or tensor.shape != TEXT.shape:
        raise InvalidItem(f"input {TEXT.name!r} must be BYTES of shape [1]")
    return bytes(tensor.data[0])
