"""`torchscript`: a TorchScript file (`--model-path`) that maps one tensor to one tensor.

Each item carries `input`, FP32, of any shape; the items of a batch are stacked along a new
first dimension, so an item whose shape differs from the batch's first valid item is
refused. The module must return a tensor whose first dimension is the batch; each item gets
its row as `output`, FP32. With `--dtype fp16|bf16` the module and its inputs run in that
dtype. There is no example input to warm up with, so warm-up is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.device import to_device
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    Handler,
    Prepared,
    check_limits,
    output_rows,
    split_valid,
)

# The most one item may hold: 64 MiB of FP32, more than a 3 x 2048 x 2048 image.
MAX_ITEM_ELEMENTS = 1 << 24
INPUT = TensorSpec("input", "FP32", (-1,), max_elements=MAX_ITEM_ELEMENTS)
OUTPUT = TensorSpec("output", "FP32", (-1,))


class TorchScriptHandler(Handler[torch.Tensor, torch.Tensor]):
    preprocess_overlaps_infer = True
    metadata = Metadata(platform="pytorch_torchscript", inputs=(INPUT,), outputs=(OUTPUT,))

    def load(self, device: torch.device) -> None:
        if self.settings.model_path is None:
            raise ValueError("the torchscript handler needs --model-path")
        self.device = device
        # torch.jit.load carries no annotations.
        module = torch.jit.load(  # type: ignore[no-untyped-call]
            str(self.settings.model_path), map_location=device
        )
        self.module = module.to(self.settings.dtype).eval()

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        arrays, rejected = split_valid(items, self.array_of)
        rows: list[npt.NDArray[np.float32]] = []
        valid_indices = [index for index in range(len(items)) if index not in rejected]
        for index, array in zip(valid_indices, arrays, strict=True):
            if rows and array.shape != rows[0].shape:
                rejected[index] = (
                    f"input 'input' has shape {list(array.shape)} but this batch stacks "
                    f"shape {list(rows[0].shape)}; send differently shaped items separately"
                )
            else:
                rows.append(array)
        if not rows:
            return Prepared(None, 0, rejected)
        batch = to_device(torch.from_numpy(np.stack(rows)).to(self.settings.dtype), self.device)
        return Prepared(batch, len(rows), rejected)

    def array_of(self, item: Item) -> npt.NDArray[np.float32]:
        """The item's input, refused unless FP32 and within the limits."""
        return _array_of(item)

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        output = self.module(batch)
        if not isinstance(output, torch.Tensor):
            raise TypeError(
                f"the TorchScript module returned {type(output).__name__}, not a tensor"
            )
        return output

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return output_rows(OUTPUT.name, outputs.float().cpu().numpy())


def _array_of(item: Item) -> npt.NDArray[np.float32]:
    tensor = item.get(INPUT.name)
    if tensor is None:
        raise InvalidItem(f"missing input {INPUT.name!r}; item has {sorted(item) or 'none'}")
    if tensor.datatype != INPUT.datatype:
        raise InvalidItem(f"input {INPUT.name!r} must be FP32, got {tensor.datatype}")
    check_limits(tensor, INPUT)
    array: npt.NDArray[np.float32] = tensor.to_numpy()
    return array
