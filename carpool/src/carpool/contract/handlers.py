"""The built-in handlers: the short names a BatchedModel or `--handler` may use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Short name -> `module:Class`; the operator needs the names only, the model server imports.
BUILTIN_HANDLERS: Mapping[str, str] = MappingProxyType(
    {
        "toy": "carpool_model_server.handler_toy:ToyHandler",
        "torchscript": "carpool_model_server.handler_torchscript:TorchScriptHandler",
        "text-embedding": "carpool_model_server.handler_text_embedding:TextEmbeddingHandler",
        "text-generation": "carpool_model_server.handler_text_generation:TextGenerationHandler",
        "stand-in": "carpool_model_server.handler_stand_in:StandInHandler",
    }
)
