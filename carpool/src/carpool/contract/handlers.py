"""The built-in handlers: the short names a BatchedModel or `--handler` may use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Short name -> `module:Class`; the operator needs the names only, the model server imports.
BUILTIN_HANDLERS: Mapping[str, str] = MappingProxyType(
    {
        "toy": "carpool_model_server.handler_toy:ToyHandler",
        "torchscript": "carpool_model_server.handler_torchscript:TorchScriptHandler",
        "torch-export": "carpool_model_server.handler_torch_export:TorchExportHandler",
        "text-embedding": "carpool_model_server.handler_text_embedding:TextEmbeddingHandler",
        "text-classification": (
            "carpool_model_server.handler_text_classification:TextClassificationHandler"
        ),
        "image-classification": (
            "carpool_model_server.handler_image_classification:ImageClassificationHandler"
        ),
        "text-generation": "carpool_model_server.handler_text_generation:TextGenerationHandler",
        "stand-in": "carpool_model_server.handler_stand_in:StandInHandler",
    }
)

# The built-ins that serve the file or folder `--model-path` names and have no model without
# one: the model server refuses to start without it, the operator a BatchedModel.
NEEDS_MODEL_PATH: frozenset[str] = frozenset(
    {"torchscript", "torch-export", "text-classification", "image-classification"}
)
