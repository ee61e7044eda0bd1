"""carpool: dynamic request batching for PyTorch model serving on Kubernetes.

The shared core: the contract between the parts, the batching engine, and the library face
of that engine (`carpool.batch`) and a reader of streamed generation
(`carpool.generate_stream`), imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carpool.batching import Batched, batch
    from carpool.streams import StreamError, StreamEvent, generate_stream

__all__ = ["Batched", "StreamError", "StreamEvent", "batch", "generate_stream"]

# public name -> module that defines it
_LAZY = {
    "Batched": "carpool.batching",
    "batch": "carpool.batching",
    "StreamError": "carpool.streams",
    "StreamEvent": "carpool.streams",
    "generate_stream": "carpool.streams",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'carpool' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
