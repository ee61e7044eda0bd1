"""A streamed answer's text, decoded token by token as the tokens come.

Decoding the whole answer again at every token costs its length at every step: on the
token loop's event loop thread, for every running sequence, while the step beside it wants
the same interpreter. A tokenizer with a `tokenizers` backend decodes each new token once,
with that library's `DecodeStream` (which holds a character still being spelt out), and
gives the same text as decoding all the tokens at once. A tokenizer without one, or one
that rewrites spaces after decoding (`clean_up_tokenization_spaces`, which transformers
applies to no BPE's text), decodes the whole answer every time, holding a space near its
end that the clean-up may still take away ("sky '" before "s" is "sky's").

A run of byte tokens (byte fallback, as Llama's tokenizer spells rare characters) that
turns out to be no UTF-8 decodes as one U+FFFD per byte, rewriting a character the stream
already gave ("é" and one more byte: three U+FFFD). `DecodeStream` refuses such a token
(the text no longer begins with what it gave); the stream then starts afresh at the
tokens it has not shown yet, and the text shown stands.

An answer is the text its tokens add to the prompt's (`answer_text`), as transformers'
text-generation pipeline answers without the prompt: a SentencePiece piece carries the
space before its word ("▁on") and decoding drops the text's first space, so after "the cat
sat" the answer reads " on the mat". Both the stream and the whole answer decode the
prompt's last CONTEXT_TOKENS before the answer's, never the whole prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# transformers' clean-up patterns are a space and at most 3 characters (" n't").
CLEAN_UP_REACH = 3
# The prompt's tokens decoded before an answer's: its first token reads as it does after
# the prompt with one; a few more cover a decoder's or clean-up's reach across tokens.
CONTEXT_TOKENS = 5
# How `DecodeStream.step` says that a token rewrote text it gave before.
REWRITTEN = "Invalid prefix encountered"


class StreamedText:
    """The text of one sequence's tokens so far, short of a character not spelt out yet."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._context = list(prompt_ids[-CONTEXT_TOKENS:])
        self._cleans = _cleans_up(tokenizer)
        self._before = _decoded(tokenizer, self._context, self._cleans)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # A stream started after text that ends in U+FFFD (a prompt that ends in it) waits
        # for the rest of a character and then shows that text too: decoded whole instead.
        whole = backend is None or self._cleans or self._before.endswith("\ufffd")
        self._backend: Any = None if whole else backend
        self._stream: Any = None if whole else _decode_stream(self._context)
        self._decoded = 0  # tokens decoded into `text`
        self._shown = 0  # tokens whose text is all in `text`
        self.text = ""

    def extend(self, tokens: Sequence[int]) -> str:
        """The text of `tokens` after the prompt's (the same sequence's tokens, one or more
        longer than last time)."""
        if self._stream is None:
            text = _read_on(self._tokenizer, self._context, self._before, tokens, self._cleans)
            text = text.rstrip("\ufffd")
            # The clean-up takes away a space before what may still follow (" 's", " n't",
            # " ' "): a space among the last CLEAN_UP_REACH characters is held.
            held = text.rfind(" ", max(len(text) - CLEAN_UP_REACH, 0)) if self._cleans else -1
            self.text = text if held < 0 else text[:held]
        else:
            index = self._decoded
            while index < len(tokens):
                try:
                    piece = self._stream.step(self._backend, tokens[index])
                except Exception as error:  # tokenizers raises Exception itself
                    if REWRITTEN not in str(error):
                        raise
                    # Afresh from the first token not shown: a fresh stream has shown
                    # nothing its next tokens could rewrite, so this ends. (It starts at a
                    # token that showed nothing, a byte as a rule: no word's space is lost.)
                    self._stream = _decode_stream([])
                    index = self._shown
                    continue
                index += 1
                if piece:
                    self.text += piece
                    self._shown = index
        self._decoded = len(tokens)
        return self.text


def answer_text(tokenizer: Any, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text `new_ids` add to the prompt's: both decoded together, the prompt's text cut
    off (transformers' text-generation pipeline's answer without the prompt), decoding only
    the prompt's last CONTEXT_TOKENS."""
    context = list(prompt_ids[-CONTEXT_TOKENS:])
    cleans = _cleans_up(tokenizer)
    return _read_on(tokenizer, context, _decoded(tokenizer, context, cleans), new_ids, cleans)


def _read_on(
    tokenizer: Any, context: list[int], before: str, new_ids: Sequence[int], cleans: bool
) -> str:
    """The text of `new_ids` after `context`, whose own text is `before`. The clean-up, where
    the tokenizer makes one, applies to that text alone: across the join it rewrites both
    sides (" ' " to "'"), and the prompt's text would no longer be the first len(before)
    characters."""
    text = _decoded(tokenizer, [*context, *new_ids], cleans)[len(before) :]
    return str(tokenizer.clean_up_tokenization(text)) if cleans else text


def _decoded(tokenizer: Any, ids: list[int], cleans: bool) -> str:
    """The text of `ids`, not cleaned up (see `_read_on`)."""
    raw = {"clean_up_tokenization_spaces": False} if cleans else {}
    return str(tokenizer.decode(ids, skip_special_tokens=True, **raw))


def _cleans_up(tokenizer: Any) -> bool:
    """Whether the tokenizer's `decode` rewrites spaces after decoding: transformers does
    where the tokenizer's config asks, but for a BPE one (byte-level: it would strip real
    spaces) unless forced; an older transformers cleans up BPE's text too."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    forced = getattr(
        tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", None
    )
    backend = getattr(tokenizer, "backend_tokenizer", None)
    bpe = backend is not None and type(backend.model).__name__ == "BPE"
    return not bpe or forced is not False


def _decode_stream(context: list[int]) -> Any:
    """A stream whose first text is what its first token adds to `context`'s."""
    from tokenizers.decoders import DecodeStream

    return DecodeStream(ids=context, skip_special_tokens=True)
