"""Texts in, one padded batch of tokens out: what the encoder handlers share.

`text-embedding` and `text-classification` take one text per item (`text`, BYTES [1]) and
run a Hugging Face encoder on a batch of them. Each text is cut to its first
`max_tokens * CHARS_PER_TOKEN` characters before tokenizing and truncated to the model's
`max_tokens`; a text over MAX_TEXT_BYTES is refused, so no item holds the worker longer than
the longest sequence the model takes does.

On a GPU each batch is padded to the next of a few sequence-length buckets, so that shapes
repeat and warm-up can run every one of them (the first run of a shape is slow there); on a
CPU, where shapes cost nothing to change and padding costs compute, only to its longest
item. `--handler-options padding=buckets|longest` chooses either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.nn.functional import pad

from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.device import to_device
from carpool_model_server.errors import InvalidItem
from carpool_model_server.folder import read_json
from carpool_model_server.handler import Handler, Prepared, check_limits, split_valid
from carpool_model_server.handler_options import choice_option, positive_option

# Only a text's first max_tokens * CHARS_PER_TOKEN characters are tokenized: 16 per token
# is far more than any natural text needs (about 4 in English), so the truncation at
# max_tokens is unchanged, while the tokenizer's time and memory per item stay bounded.
CHARS_PER_TOKEN = 16
# Longer texts are refused (400, by the sidecar before queueing): 1 MiB per text bounds the
# memory one item takes on its way to the worker.
MAX_TEXT_BYTES = 1 << 20
TEXT = TensorSpec("text", BYTES, (1,), max_element_bytes=MAX_TEXT_BYTES)
PADDINGS = ("buckets", "longest")
# The options every text handler takes.
TEXT_OPTIONS = frozenset({"padding", "max_tokens"})
OutputsT = TypeVar("OutputsT")
# A tokenizer that knows no limit reports this (transformers' VERY_LARGE_INTEGER is 1e30).
_UNBOUNDED = 1_000_000


def buckets(max_tokens: int) -> tuple[int, ...]:
    """Sequence lengths batches pad to with padding=buckets: 16, 32, then steps of half again
    or a third, so no batch pads to more than half again its longest text; the last is
    `max_tokens` itself (16, 32, 48, 64, 96, 128, 192, 256 for 256)."""
    lengths: list[int] = []
    length = 16
    while length < max_tokens:
        lengths.append(length)
        # 16 -> 32, then x1.5 from a power of two and x4/3 back to the next one.
        power_of_two = length & (length - 1) == 0
        length = 32 if length == 16 else length * 3 // 2 if power_of_two else length * 4 // 3
    return (*lengths, max_tokens)


def model_max_tokens(path: Path, tokenizer: Any, config: Any) -> int:
    """The longest sequence the model takes: sentence-transformers' `max_seq_length` where
    the folder has one, and never more than its tokenizer or position embeddings allow."""
    limits = [
        limit
        for limit in (
            read_json(path / "sentence_bert_config.json").get("max_seq_length"),
            getattr(tokenizer, "model_max_length", None),
            getattr(config, "max_position_embeddings", None),
        )
        if isinstance(limit, int) and 0 < limit < _UNBOUNDED
    ]
    if not limits:
        raise ValueError(f"{path} states no maximum sequence length; set max_tokens")
    return min(limits)


@dataclass(frozen=True, slots=True)
class Tokens:
    """One batch: the tokenizer's columns (input_ids, attention_mask, token_type_ids where
    the model has them), on the device."""

    columns: Mapping[str, torch.Tensor]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.columns["attention_mask"]


class TextBatcher:
    """Tokenizes the valid texts of a batch into one padded `Tokens`."""

    def __init__(self, tokenizer: Any, max_tokens: int, device: torch.device, padding: str):
        if tokenizer.pad_token is None:
            # A decoder's tokenizer may have none; its end of text pads, attention masked.
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.device = device
        self.buckets = buckets(max_tokens) if padding == "buckets" else None
        self._left = getattr(tokenizer, "padding_side", "right") == "left"

    def tokens(self, texts: Sequence[str]) -> Tokens:
        encoded = self.tokenizer(
            [text[: self.max_tokens * CHARS_PER_TOKEN] for text in texts],
            padding="longest",
            truncation=True,
            # Overrides a shorter truncation a tokenizer.json may carry (MiniLM's says 128).
            max_length=self.max_tokens,
            return_tensors="pt",
        )
        columns: dict[str, torch.Tensor] = dict(encoded)
        if self.buckets is not None:
            length = columns["input_ids"].shape[1]
            extra = next(bucket for bucket in self.buckets if bucket >= length) - length
            sides = (extra, 0) if self._left else (0, extra)
            # Padding ids, no attention, segment 0: as the tokenizer pads.
            pad_id = self.tokenizer.pad_token_id or 0
            columns = {
                name: pad(column, sides, value=pad_id if name == "input_ids" else 0)
                for name, column in columns.items()
            }
        return Tokens({name: to_device(column, self.device) for name, column in columns.items()})

    def warmup_items(self) -> list[Item]:
        """One text per bucket, shortest first, each about as long as its bucket (a word a
        token, and the two a BERT tokenizer adds); without buckets one past the longest."""
        if self.buckets is None:
            return [text_item(" ".join(["the"] * (self.max_tokens + 8)))]
        return [text_item(" ".join(["the"] * max(bucket - 2, 1))) for bucket in self.buckets]


class TextHandler(Handler[Tokens, OutputsT]):
    """A handler of one text per item: `load` sets `self.texts` with `text_batcher`."""

    preprocess_overlaps_infer = True  # the tokenizer serves preprocess alone
    # A fast tokenizer is thread-safe and releases the GIL: batches tokenize on several cores.
    preprocess_concurrently = True
    texts: TextBatcher

    def check_text_options(self) -> None:
        """For `__init__`: refuse a bad `padding` or `max_tokens` before anything loads."""
        choice_option(self.settings.options, "padding", PADDINGS)
        positive_option(self.settings.options, "max_tokens")

    def text_batcher(
        self, path: Path, tokenizer: Any, config: Any, device: torch.device
    ) -> TextBatcher:
        """Batches for the model at `path`, cut at its maximum length or `max_tokens`."""
        longest = model_max_tokens(path, tokenizer, config)
        max_tokens = min(longest, positive_option(self.settings.options, "max_tokens") or longest)
        padding = self.settings.options.get("padding")
        if padding is None:
            padding = "buckets" if device.type == "cuda" else "longest"
        return TextBatcher(tokenizer, max_tokens, device, padding)

    def preprocess(self, items: Sequence[Item]) -> Prepared[Tokens]:
        texts, rejected = split_valid(items, text_of)
        if not texts:
            return Prepared(None, 0, rejected)
        return Prepared(self.texts.tokens(texts), len(texts), rejected)

    def example_item(self) -> Item:
        return text_item("carpool warms up the model.")

    def warmup_items(self) -> list[Item]:
        return self.texts.warmup_items()


def text_item(text: str) -> Item:
    return {TEXT.name: Tensor(BYTES, (1,), [text.encode()])}


def text_of(item: Item) -> str:
    """The item's text; InvalidItem unless it is one UTF-8 string within MAX_TEXT_BYTES."""
    tensor = item.get(TEXT.name)
    if tensor is None:
        raise InvalidItem(f"missing input {TEXT.name!r}; item has {sorted(item) or 'none'}")
    if tensor.datatype != BYTES or tensor.element_count != 1:
        raise InvalidItem(
            f"input {TEXT.name!r} must be BYTES holding one string, got {tensor.datatype} "
            f"shape {list(tensor.shape)}"
        )
    assert isinstance(tensor.data, list)  # Tensor.check made it a list of bytes
    check_limits(tensor, TEXT)
    try:
        return tensor.data[0].decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidItem(f"input {TEXT.name!r} is not UTF-8 text: {error}") from None
