"""A streamed answer's text, decoded token by token as the tokens come.

Decoding the whole answer again at every token costs its length at every step: on the
token loop's event loop thread, for every running sequence, while the step beside it wants
the same interpreter. A tokenizer with a `tokenizers` backend decodes each new token once,
with that library's `DecodeStream` (which holds a character still being spelt out), and
gives the same text as decoding all the tokens at once. A tokenizer without one, or one
that rewrites spaces after decoding (`clean_up_tokenization_spaces`), decodes the whole
answer every time, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StreamedText:
    """The text of one sequence's tokens so far, short of a character not spelt out yet."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        whole = backend is None or bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._backend: Any = None if whole else backend
        self._stream = None if whole else DecodeStream(skip_special_tokens=True)
        self._decoded = 0  # tokens decoded into `text`
        self.text = ""

    def extend(self, tokens: Sequence[int]) -> str:
        """The text of `tokens` (the same sequence's, one or more longer than last time)."""
        if self._stream is None:
            text: str = self._tokenizer.decode(list(tokens), skip_special_tokens=True)
            self.text = text.rstrip("\ufffd")
        else:
            for token in tokens[self._decoded :]:
                piece = self._stream.step(self._backend, token)
                if piece:
                    self.text += piece
        self._decoded = len(tokens)
        return self.text
