"""What one request may hold, checked from what it declares before its data is converted.

A request's item count and tensor bytes follow from its declared shapes, datatypes and
binary sizes; checking them first answers an oversized request in the time it takes to read
its JSON header, with no per-item object or converted copy made.
"""

from __future__ import annotations

from carpool.contract.wire import BYTES, NUMPY_DTYPES
from carpool_sidecar.tensors import element_count


def declared_bytes(datatype: str, shape: tuple[int, ...], binary_size: int | None) -> int:
    """The bytes a tensor will take: its binary size if sent so, else its element count
    times the element size (BYTES elements count as their 4-byte length prefix, at least)."""
    if binary_size is not None:
        return binary_size
    itemsize = 4 if datatype == BYTES else NUMPY_DTYPES[datatype].itemsize
    return element_count(shape) * itemsize
