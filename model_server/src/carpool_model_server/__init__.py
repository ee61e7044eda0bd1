"""The model server: runs whole batches through a torch model.

Also the in-process face of it, imported on first use: `batch_inference` and
`BatchInference` run a handler over a list of items without any server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from carpool_model_server.offline import BatchInference, batch_inference

__all__ = ["BatchInference", "batch_inference"]

# public name -> module that defines it
_LAZY = {
    "BatchInference": "carpool_model_server.offline",
    "batch_inference": "carpool_model_server.offline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'carpool_model_server' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
