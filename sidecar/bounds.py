"""What one request may hold, checked from what it declares before its data is converted.

A request's item count and tensor bytes follow from its declared shapes, datatypes and
binary sizes; checking them first answers an oversized request in the time it takes to read
its JSON header, with no per-item object or converted copy made.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from carpool.contract.wire import BYTES, NUMPY_DTYPES
from carpool.sidecar.errors import PayloadTooLarge
from carpool.sidecar.tensors import element_count


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """The most items and tensor bytes one request may bring (maxQueueItems, maxQueueBytes)."""

    max_items: int
    max_bytes: int

    def check_items(self, items: int) -> None:
        if items > self.max_items:
            raise PayloadTooLarge(
                f"request has {items} items, more than maxQueueItems {self.max_items}"
            )

    def check_bytes(self, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            raise PayloadTooLarge(
                f"request has {nbytes} bytes of tensor data, more than maxQueueBytes "
                f"{self.max_bytes}"
            )


# For callers outside the sidecar that take any request (the benchmark's own servers).
UNBOUNDED = RequestBounds(sys.maxsize, sys.maxsize)


def declared_bytes(datatype: str, shape: tuple[int, ...], binary_size: int | None) -> int:
    """The bytes a tensor will take: its binary size if sent so, else its element count
    times the element size (BYTES elements count as their 4-byte length prefix, at least)."""
    if binary_size is not None:
        return binary_size
    itemsize = 4 if datatype == BYTES else NUMPY_DTYPES[datatype].itemsize
    return element_count(shape) * itemsize
