"""A tiny GPT-2 and word-level tokenizer built from a config with a fixed seed: no download.

The weights are drawn wider than GPT-2's own initialisation so that the logits of the next
token are far apart: greedy decoding then has no near-ties that float rounding could flip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# fmt: off
WORDS = [
    "the", "a", "cat", "dog", "sat", "on", "mat", "rug", "ran", "far", "away", "quickly",
    "slowly", "red", "blue", "green", "big", "small", "house", "tree", "river", "sky", "sun",
    "moon", "star", "night", "day", "morning", "evening", "rain", "snow", "wind", "carpool",
    "model", "batch", "queue", "item", "token", "prompt", "answer",
]
# fmt: on
EOS = "<|endoftext|>"
UNK = "<unk>"


def build_tiny_lm(
    folder: Path,
    layers: int = 2,
    width: int = 64,
    seed: int = 0,
    context: int = 256,
    grouped_queries: bool = False,
) -> Path:
    """Save a random GPT-2 and its tokenizer to `folder`, loadable with `from_pretrained`;
    with `grouped_queries`, a Llama whose 4 query heads share 2 key-value heads instead."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    vocab = {word: index for index, word in enumerate([EOS, UNK, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token=UNK)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    shared: dict[str, Any] = {
        "vocab_size": len(vocab),
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": 0.3,
    }
    if grouped_queries:
        llama = LlamaConfig(
            max_position_embeddings=context,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            **shared,
        )
        LlamaForCausalLM(llama).save_pretrained(folder)
        return folder
    config = GPT2Config(n_positions=context, n_embd=width, n_layer=layers, n_head=4, **shared)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder
