"""carpool: dynamic request batching for PyTorch model serving on Kubernetes.

The library faces are imported on first use, so that `carpool operator` never loads torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carpool.batching import Batched, batch
    from carpool.offline import BatchInference, batch_inference

__all__ = ["BatchInference", "Batched", "batch", "batch_inference"]

# public name -> module that defines it
_LAZY = {
    "Batched": "carpool.batching",
    "batch": "carpool.batching",
    "BatchInference": "carpool.offline",
    "batch_inference": "carpool.offline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'carpool' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
