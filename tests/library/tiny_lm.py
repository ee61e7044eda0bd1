"""A tiny GPT-2 and word-level tokenizer built from a config with a fixed seed: no download.

The weights are drawn wider than GPT-2's own initialisation so that the logits of the next
token are far apart: greedy decoding then has no near-ties that float rounding could flip.
"""

from __future__ import annotations

from pathlib import Path

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
    folder: Path, layers: int = 2, width: int = 64, seed: int = 0, context: int = 256
) -> Path:
    """Save a random GPT-2 and its tokenizer to `folder`, loadable with `from_pretrained`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate([EOS, UNK, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token=UNK)
    tokenizer.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=context,
        n_embd=width,
        n_layer=layers,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder
