"""A streamed answer's text, token by token: the same text as decoding every token at once."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from carpool_model_server.streamed_text import StreamedText

MIXED = "héllo 日本 wörld 🙂 the sky, the sun."


@pytest.fixture(scope="module")
def byte_level() -> Any:
    """A GPT-2 style tokenizer (byte-level BPE) with few merges: characters outside ASCII
    take several tokens, each spelling out part of one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
    )
    core.train_from_iterator(["héllo wörld", "the sky the sun hello world"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def texts_as_tokens_come(tokenizer: Any, ids: list[int]) -> list[str]:
    text = StreamedText(tokenizer)
    return [text.extend(ids[:count]) for count in range(1, len(ids) + 1)]


def assert_streams_as_decoded(tokenizer: Any, ids: list[int]) -> None:
    """Each text is the last one and more, holds no half-spelt character, and the last is
    the whole decoded text but for one still being spelt out."""
    texts = texts_as_tokens_come(tokenizer, ids)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    for before, after in zip(["", *texts], texts, strict=False):
        assert after.startswith(before)
        assert not after.endswith("\ufffd")
    assert texts[-1] == whole.rstrip("\ufffd")


def test_characters_split_across_tokens_come_whole(byte_level: Any) -> None:
    ids = byte_level(MIXED)["input_ids"]
    assert len(ids) > len(MIXED.split())  # characters were split over tokens
    texts = texts_as_tokens_come(byte_level, ids)
    assert texts[-1] == MIXED
    assert "日" in texts[-1] and not any("\ufffd" in text for text in texts)
    assert_streams_as_decoded(byte_level, ids)


@pytest.mark.parametrize("seed", range(4))
def test_any_tokens_stream_as_they_decode(byte_level: Any, tiny_lm_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    for tokenizer in (byte_level, AutoTokenizer.from_pretrained(tiny_lm_path)):
        ids = [rng.randrange(len(tokenizer)) for _ in range(60)]
        assert_streams_as_decoded(tokenizer, ids)


def test_a_tokenizer_that_cleans_up_spaces_streams_the_cleaned_text() -> None:
    """transformers' clean-up rewrites text across tokens after decoding ("sky ." to
    "sky.", "sky ' s" to "sky's"): such a tokenizer's text is decoded whole, cleaned up as
    its answer is, and a space the next tokens may still take away is held."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<eos>", "<unk>", "the", "sky", ".", "do", "n't", "'", "s"]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", clean_up_tokenization_spaces=True
    )
    ids = tokenizer("the sky . do n't the sky ' s")["input_ids"]
    assert tokenizer.decode(ids) == "the sky. don't the sky's"
    texts = texts_as_tokens_come(tokenizer, ids)
    assert all(after.startswith(before) for before, after in itertools.pairwise(texts))
    assert texts[-1] == tokenizer.decode(ids)


def test_bytes_that_turn_out_no_character_do_not_break_the_stream() -> None:
    """A Llama-style tokenizer spells rare characters byte by byte (byte fallback) and
    decodes a run of bytes that is no UTF-8 as one U+FFFD per byte: a byte after a whole
    "é" rewrites it. The stream goes on from that byte; the text so far stands."""
    from tokenizers import Tokenizer, decoders, models

    pieces = ["<unk>", "<s>", "</s>", "\u2581the", "\u2581sky", "<0xC3>", "<0xA9>", "<0x97>"]
    vocab = {piece: index for index, piece in enumerate(pieces)}
    core = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    core.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")
    the, sky, c3, a9, x97 = (vocab[piece] for piece in pieces[3:])
    ids = [the, c3, a9, sky]
    assert texts_as_tokens_come(tokenizer, ids) == ["the", "the", "theé", "theé sky"]
    assert tokenizer.decode(ids) == "theé sky"
    texts = texts_as_tokens_come(tokenizer, [the, c3, a9, x97, the])
    assert texts == ["the", "the", "theé", "theé", "theé\ufffd the"]
    rng = random.Random(0)
    for _ in range(200):  # any tokens: each text the last one and more
        texts = texts_as_tokens_come(tokenizer, [rng.randrange(len(pieces)) for _ in range(12)])
        assert all(after.startswith(before) for before, after in itertools.pairwise(texts))


def test_a_byte_level_tokenizer_that_asks_for_clean_up_streams_token_by_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers cleans up no byte-level BPE's text (it would strip real spaces), though
    its config may ask (Llama 3's does): such text is decoded token by token, not whole
    again at every token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<eos>"])
    core.train_from_iterator(["the sky . do n't", "the sun ."], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", clean_up_tokenization_spaces=True
    )
    ids = tokenizer("the sky . do n't")["input_ids"]
    decoded: list[int] = []
    decode = tokenizer.decode

    def counting(token_ids: list[int], **kwargs: Any) -> str:
        decoded.append(len(token_ids))
        return str(decode(token_ids, **kwargs))

    monkeypatch.setattr(tokenizer, "decode", counting)
    assert texts_as_tokens_come(tokenizer, ids)[-1] == decode(ids) == "the sky . do n't"
    assert decoded == []
