"""A streamed answer's text, token by token: the same text as decoding every token at once,
read on from the prompt's, as the answer's text is."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from library.tiny_lm import WORDS, after_prompt, sentencepiece_tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from carpool_model_server.streamed_text import (
    CLEAN_UP_REACH,
    CONTEXT_TOKENS,
    StreamedText,
    answer_text,
)

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


@pytest.fixture(scope="module")
def sentencepiece() -> Any:
    return sentencepiece_tokenizer()


def count_decodes(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the token lists the tokenizer's `decode` is given from now on."""
    decoded: list[int] = []
    decode = tokenizer.decode

    def counting(ids: list[int], **kwargs: Any) -> str:
        decoded.append(len(ids))
        return str(decode(ids, **kwargs))

    monkeypatch.setattr(tokenizer, "decode", counting)
    return decoded


def texts_as_tokens_come(
    tokenizer: Any, ids: list[int], prompt_ids: Sequence[int] = ()
) -> list[str]:
    text = StreamedText(tokenizer, prompt_ids)
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


@pytest.mark.parametrize("seed", range(2))
def test_tokens_that_come_together_read_as_they_do_one_at_a_time(
    byte_level: Any, sentencepiece: Any, cleaning: Any, tiny_lm_path: Path, seed: int
) -> None:
    """A reader behind the token loop takes a sequence's tokens several at a time: the text
    at each is the one it reads taking them one by one (bytes that turn out no character
    among them, for the Llama-style tokenizer; spaces held for the clean-up)."""
    rng = random.Random(seed)
    lm = AutoTokenizer.from_pretrained(tiny_lm_path)
    for tokenizer in (byte_level, sentencepiece, cleaning, lm):
        ids = [rng.randrange(len(tokenizer)) for _ in range(60)]
        prompt = [rng.randrange(len(tokenizer)) for _ in range(8)]
        one_by_one = texts_as_tokens_come(tokenizer, ids, prompt)
        text, count = StreamedText(tokenizer, prompt), 0
        while count < len(ids):
            count = min(len(ids), count + rng.randint(2, 9))
            assert text.extend(ids[:count]) == one_by_one[count - 1]


@pytest.fixture(scope="module")
def cleaning() -> Any:
    """A word-level tokenizer whose text transformers cleans up after decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<eos>", "<unk>", *WORDS, ".", "do", "n't", "'", "s", ","]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", clean_up_tokenization_spaces=True
    )


def test_a_tokenizer_that_cleans_up_spaces_streams_the_cleaned_text(cleaning: Any) -> None:
    """transformers' clean-up rewrites text across tokens after decoding ("sky ." to
    "sky.", "sky ' s" to "sky's"): such a tokenizer's text is decoded whole, cleaned up as
    its answer is, and a space the next tokens may still take away is held."""
    tokenizer = cleaning
    ids = tokenizer("the sky . do n't the sky ' s")["input_ids"]
    assert tokenizer.decode(ids) == "the sky. don't the sky's"
    texts = texts_as_tokens_come(tokenizer, ids)
    assert all(after.startswith(before) for before, after in itertools.pairwise(texts))
    assert texts[-1] == tokenizer.decode(ids)
    texts = texts_as_tokens_come(tokenizer, ids[2:], ids[:2])  # after the prompt "the sky"
    assert all(after.startswith(before) for before, after in itertools.pairwise(texts))
    assert texts[-1] == after_prompt(tokenizer, ids[:2], ids[2:]) == ". don't the sky's"


def test_clean_up_across_the_prompt_s_end_takes_no_character_of_the_answer(
    cleaning: Any,
) -> None:
    """Cleaned up together, "the sky ' the sun" reads "the sky'the sun": its first 9
    characters are no longer the prompt's "the sky '", and cutting them off took the
    answer's "t". The clean-up applies to the answer's own text."""
    prompt = cleaning("the sky '")["input_ids"]
    answer = cleaning("the sun")["input_ids"]
    assert answer_text(cleaning, prompt, answer) == " the sun"
    assert texts_as_tokens_come(cleaning, answer, prompt)[-1] == " the sun"


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
    assert tokenizer.decode(ids) == "the sky . do n't"
    decoded = count_decodes(tokenizer, monkeypatch)
    assert texts_as_tokens_come(tokenizer, ids)[-1] == "the sky . do n't"
    assert texts_as_tokens_come(tokenizer, ids[2:], ids[:2])[-1] == " . do n't"
    assert decoded == [0, 2]  # the prompt's text, once: none of the answer's


def test_an_answer_reads_on_from_its_prompt(sentencepiece: Any) -> None:
    """A SentencePiece piece carries the space before its word ("\u2581on") and decoding
    drops the text's first space: after "the cat sat" the answer reads " on the mat"."""
    prompt = sentencepiece("the cat sat")["input_ids"]
    answer = sentencepiece("on the mat", add_special_tokens=False)["input_ids"]
    assert sentencepiece.decode(answer) == "on the mat"
    assert texts_as_tokens_come(sentencepiece, answer, prompt) == [" on", " on the", " on the mat"]
    assert answer_text(sentencepiece, prompt, answer) == " on the mat"
    # A prompt that ends in U+FFFD itself: a decode stream would wait for the rest of a
    # character there, then show the prompt's text with the answer's.
    prompt = sentencepiece("the sky \ufffd")["input_ids"]
    assert texts_as_tokens_come(sentencepiece, answer, prompt) == [" on", " on the", " on the mat"]


def cut_texts(
    tokenizer: Any, rng: random.Random, count: int
) -> Iterator[tuple[list[int], list[int]]]:
    """(prompt, answer) token ids: texts of words, parts of words and characters spelt in
    bytes, cut between two characters at any token, the prompt at times long."""
    words = [*WORDS, "héllo", "日本", "wörld", "🙂", "s", ".", "'", "n't", ","]
    for _ in range(count):
        text = " ".join(rng.choices(words, k=rng.choice([3, 12, 80])))
        ids = tokenizer(text)["input_ids"]
        cuts = [
            cut
            for cut in range(1, len(ids))
            if not tokenizer.decode(ids[:cut]).endswith("\ufffd")
            and not tokenizer.decode(ids[cut:]).startswith("\ufffd")
        ]
        cut = rng.choice(cuts)
        yield ids[:cut], ids[cut:]


def cleaned_alone(tokenizer: Any, prompt: list[int], answer: list[int]) -> str:
    """The pipeline's answer from the text before its clean-up, then cleaned up alone."""
    raw = {"clean_up_tokenization_spaces": False, "skip_special_tokens": True}
    before = tokenizer.decode(prompt, **raw)
    text: str = tokenizer.decode([*prompt, *answer], **raw)[len(before) :]
    return str(tokenizer.clean_up_tokenization(text))


@pytest.mark.parametrize("seed", range(3))
def test_answers_are_what_they_add_to_the_prompt_s_text(
    sentencepiece: Any, byte_level: Any, cleaning: Any, tiny_lm_path: Path, seed: int
) -> None:
    """Streamed and whole, an answer is the pipeline's, decoded after a few prompt tokens
    alone (cleaned up on its own where the tokenizer cleans up); a byte-level BPE's (GPT-2's)
    is its tokens' own text, as before. (A stream holds a space near its end that clean-up
    may still take away.)"""
    rng = random.Random(seed)
    tokenizers = [sentencepiece, byte_level, AutoTokenizer.from_pretrained(tiny_lm_path), cleaning]
    for tokenizer in tokenizers:
        for prompt, answer in cut_texts(tokenizer, rng, 25):
            expected = (
                cleaned_alone(tokenizer, prompt, answer)
                if tokenizer is cleaning
                else after_prompt(tokenizer, prompt, answer)
            )
            assert answer_text(tokenizer, prompt, answer) == expected, (prompt, answer)
            texts = texts_as_tokens_come(tokenizer, answer, prompt)
            assert all(after.startswith(before) for before, after in itertools.pairwise(texts))
            held = expected.removeprefix(texts[-1])
            assert texts[-1] + held == expected
            assert not held or (tokenizer is cleaning and " " in held[:CLEAN_UP_REACH])
            if tokenizer is byte_level:
                assert expected == tokenizer.decode(answer)


def test_only_the_prompt_s_last_tokens_are_decoded(
    sentencepiece: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = sentencepiece(" ".join(WORDS * 4))["input_ids"]
    answer = sentencepiece("on the mat", add_special_tokens=False)["input_ids"]
    decoded = count_decodes(sentencepiece, monkeypatch)
    assert answer_text(sentencepiece, prompt, answer) == " on the mat"
    assert len(prompt) > 100 and max(decoded) <= CONTEXT_TOKENS + len(answer)
