"""Request priority as Triton's schedule policy extension defines it, which the Open Inference
Protocol's clients send: level 1 is the highest, then 2, 3 and so on; 0, or no priority, is
the default level, served after every level given.

The engine's queue serves the highest rank first, FIFO within a rank.
"""

from __future__ import annotations

from typing import Final

from carpool.engine.errors import BadRequest

DEFAULT_LEVEL: Final = 0
# Triton's levels are uint64.
LOWEST_LEVEL: Final = 2**64 - 1
# Below the rank of any level a client can send.
DEFAULT_RANK: Final = -(2**64)


def rank(level: int) -> int:
    """The queue rank of a request at priority `level`: higher is served first."""
    if not 0 <= level <= LOWEST_LEVEL:
        raise BadRequest(
            f"parameter 'priority' must be >= 0 (1 is the highest level, 0 the default) and "
            f"<= {LOWEST_LEVEL}, got {level}"
        )
    return DEFAULT_RANK if level == DEFAULT_LEVEL else -level
