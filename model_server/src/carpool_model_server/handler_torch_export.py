"""`torch-export`: a `torch.export` package (`--model-path`, `.pt2`) of one tensor to one.

As `torchscript` (items of `input`, FP32, stacked along a new first dimension; each item
gets its row of the result as `output`, FP32), for the format PyTorch recommends in place of
TorchScript. A program saved with `torch.export.save` must have been exported with a
dynamic batch dimension and states its per-item shape: the metadata publishes it (-1 for a
dynamic side, up to 2^24 elements an item), items of another rank or fixed side, or a side
outside its `Dim`'s range, are refused (400), a --max-batch-size over the batch `Dim`'s max
stops the load, and where no side is dynamic warm-up runs zeros of it at every batch size. An
AOTInductor package (compiled ahead with `torch._inductor.aoti_compile_and_package`, for
the device it will run on) states no shape: items of any shape up to 2^24 elements are
taken, and warm-up needs `--example-shape`, as for torchscript. The program runs in the
dtype it was exported in: `--dtype` must name it (`exported`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import torch

from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.errors import InvalidItem
from carpool_model_server.exported import check_max_batch, load_exported
from carpool_model_server.handler import require_input
from carpool_model_server.handler_torchscript import INPUT, MAX_ITEM_ELEMENTS, TorchScriptHandler


class TorchExportHandler(TorchScriptHandler):
    metadata = dataclasses.replace(TorchScriptHandler.metadata, platform="pytorch_export")

    def load(self, device: torch.device) -> None:
        if self.settings.model_path is None:
            raise ValueError("the torch-export handler needs --model-path")
        self.device = device
        exported = load_exported(self.settings.model_path, device, self.settings.dtype)
        check_max_batch(exported, self.settings.model_path, self.settings.max_batch_size)
        self.run = exported.run
        self.item_shape = exported.item_shape
        self.item_ranges = exported.item_ranges
        if self.item_shape is not None:
            # Its rank and fixed sides are checked before the program runs: an item it cannot
            # take would fail its batch (and refuse a good neighbour stacked after it).
            limit = MAX_ITEM_ELEMENTS if -1 in self.item_shape else None
            stated = TensorSpec(INPUT.name, INPUT.datatype, self.item_shape, max_elements=limit)
            self.metadata = dataclasses.replace(self.metadata, inputs=(stated,))

    def array_of(self, item: Item) -> npt.NDArray[np.float32]:
        """As torchscript takes it, and of the program's shape where it states one."""
        (spec,) = self.metadata.inputs
        if self.item_shape is None:
            return super().array_of(item)
        array: npt.NDArray[np.float32] = require_input(item, spec).to_numpy()
        for axis, (size, (least, most)) in enumerate(
            zip(array.shape, self.item_ranges, strict=True)
        ):
            if size < least or (most is not None and size > most):
                raise InvalidItem(
                    f"input {INPUT.name!r}: dimension {axis} of {size} is outside the "
                    f"program's range [{least}, {most if most is not None else 'any'}]"
                )
        return array

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        return self.run(batch)

    def example_item(self) -> Item | None:
        (spec,) = self.metadata.inputs
        if spec.variable:
            return None
        return {INPUT.name: Tensor.from_numpy(np.zeros(spec.shape, np.float32))}
