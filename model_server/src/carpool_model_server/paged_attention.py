"""Attention for the token loop that reads each sequence's own pages of the paged KV cache.

Without a paged attention kernel (on a CPU) transformers runs a step's attention as one
masked SDPA of all the step's query tokens over the keys of every sequence in it, so a
decode step of 32 sequences of 300 tokens computes 32 x 9,600 scores of which 300 per row
count, and first gathers all 9,600 keys token by token. Here the step's decoding sequences
(one query token each) gather their own pages into one padded batch and run one SDPA over
it, as `generate` runs its padded batch; a sequence with several query tokens (a prompt,
or a chunk of one) attends alone to its own keys, causally. The mask transformers builds
for its way is then not built at all (it builds none for an implementation of its own).

Registered under NAME with transformers' `AttentionInterface` and set on the model while
the loop runs: a forward without the paged cache (a static batch on the same model) goes
to transformers' SDPA with its usual mask, unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

NAME = "carpool_paged"
# The implementation this one stands in for: its masks and its forwards without a paged cache.
REPLACES = "sdpa"


class _StepLayout:
    """Where each sequence of one step reads its keys: worked out once, for all layers."""

    def __init__(self, read_index: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, page: int):
        lens_q = (cu_q[1:] - cu_q[:-1]).tolist()
        lens_k = (cu_k[1:] - cu_k[:-1]).tolist()
        starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
        reads = read_index.numel() > 0  # none: every sequence's keys are its query tokens'
        single = [i for i, n in enumerate(lens_q) if n == 1 and reads]  # decoding, batched
        # The others, each attending alone: (first query, queries, first key, keys). Padding
        # sequences (no query tokens) have nothing to attend.
        self.alone = [
            (starts_q[i], lens_q[i], starts_k[i], lens_k[i])
            for i in range(len(lens_q))
            if lens_q[i] and i not in single
        ]
        self.rows: torch.Tensor | None = None
        if single:
            # Each decoding sequence's pages in order, padded to the longest with page 0
            # (the cache's trash), and which of the padded batch's keys are its own.
            on = read_index.device
            width = max(-(-lens_k[i] // page) for i in single)
            first = torch.tensor([starts_k[i] for i in single], device=on)
            count = torch.tensor([lens_k[i] for i in single], device=on)
            slot = torch.arange(width, device=on) * page
            held = slot[None] < count[:, None]
            token = torch.where(held, first[:, None] + slot[None], 0)
            self.pages = torch.where(held, read_index[token] // page, 0).flatten()
            keys = torch.arange(width * page, device=on)
            self.keep = (keys[None] < count[:, None])[:, None, None, :]
            self.rows = torch.tensor([starts_q[i] for i in single], device=on)
            self.width = width * page


# The last step's layout, by the read index tensor it was worked out from (a new one every
# step; held here, so its id is not reused while compared).
_last: tuple[torch.Tensor, _StepLayout] | None = None


def _layout(
    read_index: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, page: int
) -> _StepLayout:
    global _last
    last = _last
    if last is not None and last[0] is read_index:
        return last[1]
    layout = _StepLayout(read_index, cu_q, cu_k, page)
    _last = (read_index, layout)
    return layout


# Each loop's gathered pages, kept from step to step (by its cache): a new tensor of
# megabytes for every layer cost several times the copy into it, in page faults.
_gathered: weakref.WeakKeyDictionary[Any, torch.Tensor] = weakref.WeakKeyDictionary()


def _gather(
    cache: Any, pages_k: torch.Tensor, pages_v: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pages `table` names, keys' and values', into the loop's buffer."""
    count = len(table)
    buffer = _gathered.get(cache)
    if buffer is None or buffer.shape[1] < count:
        buffer = pages_k.new_empty(2, count, *pages_k.shape[1:])
        _gathered[cache] = buffer
    keys, values = buffer[0, :count], buffer[1, :count]
    torch.index_select(pages_k, 0, table, out=keys)
    torch.index_select(pages_v, 0, table, out=values)
    return keys, values


def attend(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, step tokens, head size] for the paged cache
    key: torch.Tensor,  # [1, kv heads, step tokens, head size]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(cache, PagedAttentionCache):
        unpaged: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return unpaged
    layer: int = module.layer_idx  # type: ignore[assignment]
    allocator: Any = cache.layer_to_allocator[layer]
    read_index = kwargs["read_index"][allocator.index]
    # The step's new keys and values into the cache, as transformers writes them (an empty
    # read index: write only).
    new_k, new_v = (x[0].transpose(0, 1) for x in (key, value))
    allocator.update(new_k, new_v, layer, read_index[:0], kwargs["write_index"][allocator.index])
    pages_k, pages_v = allocator.get_cache_for_block_table(layer)  # [pages, page, kv heads, size]
    page, heads, size = pages_k.shape[1:]
    cu_k = kwargs["cu_seq_lens_k"][allocator.layer_type]
    layout = _layout(read_index, kwargs["cu_seq_lens_q"], cu_k, page)
    gqa = query.shape[1] != heads
    out = query.new_empty(query.shape[2], query.shape[1], size)  # [step tokens, heads, size]
    if layout.rows is not None:
        batch = len(layout.rows)
        keys, values = (
            x.view(batch, layout.width, heads, size).transpose(1, 2)
            for x in _gather(cache, pages_k, pages_v, layout.pages)
        )
        queries = query[0].index_select(1, layout.rows).transpose(0, 1).unsqueeze(2)
        out[layout.rows] = scaled_dot_product_attention(
            queries, keys, values, attn_mask=layout.keep, scale=scaling, enable_gqa=gqa
        )[:, :, 0]
    flat_k, flat_v = pages_k.flatten(0, 1), pages_v.flatten(0, 1)
    for first_q, count_q, first_k, count_k in layout.alone:
        queries = query[:, :, first_q : first_q + count_q]
        if read_index.numel() == 0:  # its keys are its query tokens'
            keys = key[:, :, first_q : first_q + count_q]
            values = value[:, :, first_q : first_q + count_q]
            mask = None
        else:
            own = read_index[first_k : first_k + count_k]
            keys, values = (x.index_select(0, own).transpose(0, 1)[None] for x in (flat_k, flat_v))
            mask = torch.ones(count_q, count_k, dtype=torch.bool, device=query.device)
            mask = mask.tril(count_k - count_q)
        alone = scaled_dot_product_attention(
            queries, keys, values, mask, is_causal=mask is None, scale=scaling, enable_gqa=gqa
        )
        out[first_q : first_q + count_q] = alone[0].transpose(0, 1)
    return out[None], None


def install(model: Any) -> bool:
    """Set this attention on `model` where it stands in for its own: SDPA, every layer full
    attention (no sliding window), on a CPU (the only device it was measured on: an
    accelerator keeps transformers' way). True if set; `uninstall` puts SDPA back."""
    from transformers import AttentionInterface
    from transformers.generation.continuous_batching.cache import group_layers_by_attn_type
    from transformers.generation.continuous_batching.cache_allocators import FULL_ATTENTION
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    config = model.config.get_text_config()
    full = list(group_layers_by_attn_type(config)) == [FULL_ATTENTION]
    if model.device.type != "cpu" or config._attn_implementation != REPLACES or not full:
        return False
    AttentionInterface.register(NAME, attend)
    # Static batches on the model keep SDPA's masks.
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS[REPLACES])
    model.set_attn_implementation(NAME)
    return True


def uninstall(model: Any) -> None:
    model.set_attn_implementation(REPLACES)
