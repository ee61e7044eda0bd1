"""What one request may hold, checked from what it declares before its data is converted.

A request's item count and tensor bytes follow from its declared shapes, datatypes and
binary sizes; checking them first answers an oversized request in the time it takes to read
its JSON header, with no per-item object or converted copy made.
"""

from __future__ import annotations

import math
import re
import sys

from carpool.contract.wire import BYTES, NUMPY_DTYPES
from carpool.engine.bounds import RequestBounds
from carpool_sidecar.tensors import element_count

# A declared shape in a JSON body's text. Parsing a JSON `data` list makes one Python object
# per element, so its shapes are read from the text first (one C-level scan, no copy).
_DECLARED_SHAPE = re.compile(rb'"shape"\s*:\s*\[([0-9\s,]*)\]')
# More digits than this is more items than any queue holds (and beyond int()'s digit limit).
_MAX_DIGITS = 18


def check_declared_shapes(text: bytes | bytearray | memoryview, bounds: RequestBounds) -> None:
    """Refuse a JSON body whose declared shapes hold too many items or elements, before it is
    parsed."""
    for match in _DECLARED_SHAPE.finditer(text):
        dims = [part.strip() for part in match.group(1).split(b",")]
        if not dims or not all(dims):
            continue  # malformed: the parser says why
        sizes = [int(d) if len(d) <= _MAX_DIGITS else sys.maxsize for d in dims]
        bounds.check_items(sizes[0])
        bounds.check_elements(math.prod(sizes))


def declared_bytes(datatype: str, shape: tuple[int, ...], binary_size: int | None) -> int:
    """The bytes a tensor will take: its binary size if sent so, else its element count
    times the element size (BYTES elements count as their 4-byte length prefix, at least)."""
    if binary_size is not None:
        return binary_size
    itemsize = 4 if datatype == BYTES else NUMPY_DTYPES[datatype].itemsize
    return element_count(shape) * itemsize
