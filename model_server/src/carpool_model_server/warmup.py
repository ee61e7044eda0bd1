"""What warm-up runs before the model server says ready.

On a GPU the first batch of a (batch size, input shape) the process has not run can take
many times longer than the next (kernel selection, allocator growth), so warm-up runs every
batch size the sidecar can form, 1 to the max batch size, at every input shape the handler
forms (`Handler.warmup_items`: one per length bucket). A CPU has no such first-run cost:
powers of two are enough to load the weights' pages and size the buffers. `--warmup-sizes`
chooses the sizes, `--warmup-seconds` bounds the time.

A TorchScript file says nothing about its input, so `--example-shape` tells the server the
per-item shape; warm-up batches then hold zeros of that shape for the model's one input.
"""

from __future__ import annotations

import numpy as np
import torch

from carpool.contract.metadata import Metadata
from carpool.contract.wire import NUMPY_DTYPES, Item, Tensor


def zeros_item(metadata: Metadata, shape: tuple[int, ...]) -> Item:
    """An item of zeros of `shape`; ValueError unless the model has one numeric input."""
    if len(metadata.inputs) != 1:
        raise ValueError(f"fits a handler with one input, this one has {len(metadata.inputs)}")
    spec = metadata.inputs[0]
    dtype = NUMPY_DTYPES.get(spec.datatype)
    if dtype is None:
        raise ValueError(f"the handler's input {spec.name!r} is {spec.datatype}, not numeric")
    return {spec.name: Tensor.from_numpy(np.zeros(shape, dtype=dtype), spec.datatype)}


def default_sizes(max_batch_size: int, device: torch.device) -> tuple[int, ...]:
    """Every size on a GPU; on a CPU the powers of two up to the max, and the max."""
    if device.type == "cuda":
        return tuple(range(1, max_batch_size + 1))
    powers = [1]
    while powers[-1] * 2 <= max_batch_size:
        powers.append(powers[-1] * 2)
    if powers[-1] != max_batch_size:
        powers.append(max_batch_size)
    return tuple(powers)
