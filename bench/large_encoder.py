"""`large_encoder:LargeEncoderHandler`: a BERT-large-shaped encoder for GPU-bound runs with
no download: the text-embedding handler with its model swapped for one built from a config
(24 layers, hidden size 1024, 16 heads, 335M parameters), its weights drawn with a fixed
seed, so every run and every variant computes the same embeddings. MiniLM's tokenizer (the
same BERT vocabulary) tokenizes, loaded as the text-embedding handler loads it.

    python bench/compare.py --model bert-large --device cuda:0 --dtype fp16
    python bench/limit.py --handler large_encoder:LargeEncoderHandler \
        --handler-options layers=2,hidden=64

`layers` and `hidden` shrink it for tests (a head per 64 of hidden size, at least one).
Load it from bench/ (it is on the import path of every variant compare.py starts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from carpool.contract.metadata import TensorSpec
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_embedding import EMBEDDING, TextEmbeddingHandler

# BERT-large: what the options default to.
LAYERS, HIDDEN = 24, 1024
SEED = 0


class LargeEncoderHandler(TextEmbeddingHandler):
    options = TextEmbeddingHandler.options | {"layers", "hidden"}

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.layers = _positive(settings.options, "layers", LAYERS)
        self.hidden = _positive(settings.options, "hidden", HIDDEN)
        if self.hidden % max(1, self.hidden // 64):
            raise ValueError(f"hidden must be a multiple of 64 or below it, got {self.hidden}")

    def load(self, device: torch.device) -> None:
        """The text-embedding handler's load (tokenizer, padding), then its model and its
        width replaced."""
        from transformers import BertConfig, BertModel

        super().load(device)
        config = BertConfig(
            vocab_size=self.texts.tokenizer.vocab_size,
            num_hidden_layers=self.layers,
            hidden_size=self.hidden,
            num_attention_heads=max(1, self.hidden // 64),
            intermediate_size=4 * self.hidden,
        )
        torch.manual_seed(SEED)
        model = BertModel(config, add_pooling_layer=False)
        self.model = model.to(device=device, dtype=self.settings.dtype).eval()
        output = TensorSpec(EMBEDDING.name, EMBEDDING.datatype, (self.hidden,))
        self.metadata = dataclasses.replace(self.metadata, outputs=(output,))


def _positive(options: Any, key: str, default: int) -> int:
    text = options.get(key)
    if text is None:
        return default
    if not (text.isdigit() and int(text) > 0):
        raise ValueError(f"{key} must be a positive whole number, got {text!r}")
    return int(text)
