"""What a piece of code costs in memory, measured in process."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable


def peak_bytes(work: Callable[[], object]) -> tuple[int, Exception | None]:
    """The most memory `work` held at once (Python objects and numpy buffers alike), and
    what it raised."""
    tracemalloc.start()
    try:
        work()
    except Exception as error:  # the caller checks which
        raised: Exception | None = error
    else:
        raised = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised
