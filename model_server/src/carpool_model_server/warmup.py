"""Warm-up items made from a shape, for handlers that cannot supply an example themselves.

A TorchScript file says nothing about its input, so `--example-shape` tells the server the
per-item shape; warm-up batches then hold zeros of that shape for the model's one input.
"""

from __future__ import annotations

import numpy as np

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
