"""A tiny GPT-2 and word-level tokenizer built from a config with a fixed seed: no download;
or a tiny Llama with a Llama 2 style tokenizer (SentencePiece pieces, byte fallback).

The weights are drawn wider than GPT-2's own initialisation so that the logits of the next
token are far apart: greedy decoding then has no near-ties that float rounding could flip.
"""

from __future__ import annotations

import re
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
# SentencePiece's mark of a space: a word's piece begins with it.
SPACE = "\u2581"
BYTE = re.compile(r"<0x[0-9A-F]{2}>")


def build_tiny_lm(
    folder: Path,
    layers: int = 2,
    width: int = 64,
    seed: int = 0,
    context: int = 256,
    grouped_queries: bool = False,
    sentencepiece: bool = False,
) -> Path:
    """Save a random GPT-2 and its tokenizer to `folder`, loadable with `from_pretrained`;
    with `grouped_queries`, a Llama whose 4 query heads share 2 key-value heads instead;
    with `sentencepiece`, such a Llama with `sentencepiece_tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    if sentencepiece:
        tokenizer = sentencepiece_tokenizer()
    else:
        vocab = {word: index for index, word in enumerate([EOS, UNK, *WORDS])}
        core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
        core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token=UNK)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    shared: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id or 0,
        "eos_token_id": tokenizer.eos_token_id,
        "initializer_range": 0.3,
    }
    if grouped_queries or sentencepiece:
        llama = LlamaConfig(
            max_position_embeddings=context,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            **shared,
        )
        model = LlamaForCausalLM(llama)
        if sentencepiece:
            # A trained model seldom spells a word byte by byte; this one never does where it
            # chooses greedily (its byte pieces' logits are 0, below the best word's).
            spelt = [index for piece, index in tokenizer.get_vocab().items() if BYTE.match(piece)]
            with torch.no_grad():
                model.lm_head.weight[spelt] = 0.0
        model.save_pretrained(folder)
        return folder
    config = GPT2Config(n_positions=context, n_embd=width, n_layer=layers, n_head=4, **shared)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def sentencepiece_tokenizer() -> Any:
    """A Llama 2 style tokenizer: BPE over pieces that begin with SPACE where a word does
    (WORDS whole, other words letter by letter), "<0xNN>" byte pieces for characters it
    lacks (byte fallback), "<s>" before every prompt; its decoder turns SPACE back into a
    space and strips the text's first one."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    pieces += sorted({character for word in WORDS for character in SPACE + word})
    merges = []
    for word in WORDS:  # each word's piece grows from SPACE a letter at a time
        piece = SPACE + word
        for end in range(2, len(piece) + 1):
            if piece[:end] not in pieces:
                pieces.append(piece[:end])
                merges.append((piece[: end - 1], piece[end - 1]))
    vocab = {piece: index for index, piece in enumerate(pieces)}
    core = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    core.normalizer = normalizers.Sequence(
        [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)]
    )
    core.decoder = decoders.Sequence(
        [
            decoders.Replace(SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def after_prompt(tokenizer: Any, prompt_ids: list[int], answer_ids: list[int]) -> str:
    """The answer as transformers' text-generation pipeline gives it without the prompt
    (`return_full_text=False`): prompt and answer decoded together, the prompt's text cut."""
    prompt = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    whole = str(tokenizer.decode([*prompt_ids, *answer_ids], skip_special_tokens=True))
    return whole[len(prompt) :]
