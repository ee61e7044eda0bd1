"""Which batch a request's items may join: the BatchKey the engine groups them by, from
the request's inputs and the model's metadata (see `batch_key`)."""

from __future__ import annotations

from collections.abc import Sequence

from carpool.contract.metadata import ModelMetadata
from carpool.engine.pending import BatchKey
from carpool_sidecar import generation
from carpool_sidecar.tensors import RequestTensor, element_count

# Below this length padding costs less than splitting the traffic into more, smaller batches.
MIN_BUCKET = 64


def length_bucket(length: int) -> int:
    """The power of two at or above `length` (at least MIN_BUCKET): items in one bucket pad
    to at most double, or to MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())


def batch_key(
    inputs: Sequence[RequestTensor], metadata: ModelMetadata
) -> tuple[BatchKey, list[int] | None]:
    """The group of the request's items, and their lengths when they vary in length.

    Numeric items share a batch only when their shapes are equal, since a handler stacks
    them, unless the handler pads variable dimensions (`pads_variable_dims`): then items of
    any shape within one length bucket share a batch. BYTES items go by length bucket: a
    handler takes their elements as a list. An item's length is the largest, over its
    inputs, of the element count of the variable dimensions (padded numeric) or of the
    longest element in bytes (BYTES: a cheap proxy for the token count); an input not
    batched by length (`TensorSpec.batch_by_length`) adds none. Text generation items also
    group by their `max_new_tokens` bucket (`generation.settings_bucket`).
    """
    by_name = {tensor.name: tensor for tensor in inputs}
    signature: list[tuple[str, str | None, tuple[int, ...]]] = []
    # Plain lists, not numpy: most requests hold one item, for which numpy's calls cost more.
    lengths: list[int] | None = None
    for spec in metadata.inputs:
        tensor = by_name.get(spec.name)
        if tensor is None:  # an optional input left out
            signature.append((spec.name, None, ()))
            continue
        item_shape = tensor.shape[1:]
        padded = spec.variable and (isinstance(tensor.data, list) or metadata.pads_variable_dims)
        signature.append((spec.name, spec.datatype, spec.shape if padded else item_shape))
        if not spec.batch_by_length:
            continue
        if isinstance(tensor.data, list):
            per_item = element_count(item_shape)
            if not per_item:
                continue
            sizes = list(map(len, tensor.data))
            item_lengths = (
                sizes
                if per_item == 1
                else [max(sizes[at : at + per_item]) for at in range(0, len(sizes), per_item)]
            )
        elif padded:
            varying = [
                have for want, have in zip(spec.shape, item_shape, strict=True) if want == -1
            ]
            item_lengths = [element_count(varying)] * tensor.items
        else:
            continue
        lengths = item_lengths if lengths is None else list(map(max, lengths, item_lengths))
    settings = generation.settings_bucket(inputs)
    if lengths is None:
        return BatchKey(tuple(signature), settings=settings), None
    return BatchKey(tuple(signature), length_bucket(max(lengths)), settings), lengths
