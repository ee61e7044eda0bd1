"""What one request may bring into the queue: its items and bytes of data, checked on arrival."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from carpool.engine.errors import PayloadTooLarge


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
