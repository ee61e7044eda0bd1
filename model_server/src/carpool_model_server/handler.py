"""The handler API: what a model must provide for the server to batch it.

A handler is a class referenced by a built-in short name or as `module:Class`. The server
builds it with the settings it needs, calls `load` once on the worker thread, then for every
batch `preprocess` -> `infer` -> `postprocess`, all under `torch.inference_mode`. A handler
that sets `preprocess_overlaps_infer` has `preprocess` run on a thread of its own, for the
next batch while the worker runs this one; two `preprocess` calls never run at once unless
it also sets `preprocess_concurrently`: then batches are preprocessed on a pool of threads
sized to the pod's CPUs, several at once.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
import numpy.typing as npt
import torch

from carpool.contract.handlers import BUILTIN_HANDLERS
from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, NUMPY_DTYPES, Item, Tensor, datatype_of, known_tensor
from carpool_model_server.errors import InvalidItem

BatchT = TypeVar("BatchT")
OutputsT = TypeVar("OutputsT")
ValidT = TypeVar("ValidT")


@dataclass(frozen=True, slots=True)
class HandlerSettings:
    """What the server tells a handler before `load`."""

    model_path: Path | None
    dtype: torch.dtype
    max_batch_size: int
    # `--handler-options key=value,...`: settings of the handler's own, as `options` names.
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Prepared(Generic[BatchT]):
    """The result of `preprocess`.

    `batch` holds the accepted items only, in their original order; `rejected` maps the
    index of each refused item (in the list given to `preprocess`) to a message for its caller.
    `accepted_count` lets the server check that `postprocess` answers every accepted item.
    """

    batch: BatchT | None
    accepted_count: int
    rejected: dict[int, str] = field(default_factory=dict)


class Handler(ABC, Generic[BatchT, OutputsT]):
    """Base class of every handler. Subclasses set `metadata` and implement the four steps.

    An input's `TensorSpec` may bound what one item can cost: `max_elements` (elements per
    item, for variable dimensions) and `max_element_bytes` (bytes per BYTES element), and
    the values the model computes with (`minimum`, `maximum`). The model server publishes
    them in its metadata and the sidecar answers 400 to a request over any before queueing
    it, so one item cannot hold the worker for longer than the handler allows, nor fail in
    the model for a value it was never able to take. `require_input` (or `check_limits`)
    applies them here as well. A handler may set `self.metadata` in `load`, with limits that
    follow from the model it loaded; the sidecar reads the metadata once the server is ready.
    """

    metadata: Metadata
    # True when `preprocess` shares no mutable state with `infer` and `postprocess` (a
    # tokenizer that only preprocess calls is fine): the server then pipelines batches.
    preprocess_overlaps_infer: ClassVar[bool] = False
    # True when, on top of that, `preprocess` may run for several batches at once, on several
    # threads: it is thread-safe and spends its time where the GIL is released (a Hugging
    # Face fast tokenizer). Batches are then prepared on as many cores as the pod has.
    preprocess_concurrently: ClassVar[bool] = False
    # True when `load`, `infer` and `postprocess` must share one thread (state bound to the
    # thread that loaded the model): no batch then runs on the event loop's thread.
    one_thread: ClassVar[bool] = False
    # The keys of `settings.options` the handler takes; others are refused.
    options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, settings: HandlerSettings) -> None:
        """ValueError for an option the handler does not take (or a bad value of one)."""
        unknown = sorted(set(settings.options) - self.options)
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise ValueError(
                f"{type(self).__name__} takes no option {unknown[0]!r} (known: {known})"
            )
        self.settings = settings

    @abstractmethod
    def load(self, device: torch.device) -> None:
        """Load weights onto `device`; runs once, on the worker thread, before warm-up."""

    @abstractmethod
    def preprocess(self, items: Sequence[Item]) -> Prepared[BatchT]:
        """Validate each item and build one batch of the valid ones (see `split_valid`)."""

    @abstractmethod
    def infer(self, batch: BatchT) -> OutputsT:
        """Run the model on one batch. An exception here fails the batch; the server isolates
        the item(s) that cause it."""

    @abstractmethod
    def postprocess(self, outputs: OutputsT) -> list[dict[str, Tensor]]:
        """One map of output tensors per accepted item, in order."""

    def example_item(self) -> Item | None:
        """A valid item for warm-up batches; None skips warm-up."""
        return None

    def warmup_items(self) -> Sequence[Item]:
        """One valid item per input shape the handler forms (a handler that pads to length
        buckets gives one per bucket, shortest first): warm-up runs each at every batch size.
        By default `example_item`. Called after `load`."""
        example = self.example_item()
        return [] if example is None else [example]


# The server moves a handler's batch and outputs between its own methods without looking
# inside, so it accepts a handler of any batch and output types.
AnyHandler = Handler[Any, Any]


def split_valid(
    items: Sequence[Item], check: Callable[[Item], ValidT]
) -> tuple[list[ValidT], dict[int, str]]:
    """Run `check` on every item: its results for the valid ones, messages for the rest.

    `check` raises `InvalidItem` to refuse an item; any other exception is a bug and
    propagates.
    """
    valid: list[ValidT] = []
    rejected: dict[int, str] = {}
    for index, item in enumerate(items):
        try:
            valid.append(check(item))
        except InvalidItem as error:
            rejected[index] = str(error)
    return valid, rejected


def require_input(item: Item, spec: TensorSpec) -> Tensor:
    """The item's tensor for `spec`, refused unless its datatype and fixed dims match."""
    tensor = item.get(spec.name)
    if tensor is None:
        raise InvalidItem(f"missing input {spec.name!r}; item has {sorted(item) or 'none'}")
    if tensor.datatype != spec.datatype:
        raise InvalidItem(f"input {spec.name!r} must be {spec.datatype}, got {tensor.datatype}")
    fits = tensor.shape == spec.shape or (
        len(tensor.shape) == len(spec.shape)
        and all(want in (-1, have) for want, have in zip(spec.shape, tensor.shape, strict=True))
    )
    if not fits:
        raise InvalidItem(
            f"input {spec.name!r} must have shape {list(spec.shape)}, got {list(tensor.shape)}"
        )
    check_limits(tensor, spec)
    return tensor


def require_inputs(
    items: Sequence[Item], spec: TensorSpec
) -> tuple[dict[int, Tensor], dict[int, str]]:
    """`require_input` for a whole batch: the valid items' tensors by index, in order, and
    messages for the rest. A numeric input without a range is checked once per datatype and
    shape in the batch (its verdict depends on nothing else)."""
    tensors: dict[int, Tensor] = {}
    rejected: dict[int, str] = {}
    by_value = spec.datatype == BYTES or (spec.minimum, spec.maximum) != (None, None)
    verdicts: dict[tuple[str, tuple[int, ...]], str | None] = {}
    for index, item in enumerate(items):
        tensor = item.get(spec.name)
        kind = None if tensor is None or by_value else (tensor.datatype, tensor.shape)
        if kind is None or kind not in verdicts:
            try:
                require_input(item, spec)
                error = None
            except InvalidItem as refused:
                error = str(refused)
            if kind is not None:
                verdicts[kind] = error
        else:
            error = verdicts[kind]
        if error is None:
            assert tensor is not None  # require_input found it
            tensors[index] = tensor
        else:
            rejected[index] = error
    return tensors, rejected


def joined(tensors: Iterable[Tensor], datatype: str) -> npt.NDArray[Any]:
    """The elements of numeric tensors of `datatype`, one after another in one writable
    array: one copy for the batch (`reshape` it where they share a shape, hand it to
    `torch.from_numpy`) instead of one per item."""
    # Numeric tensors hold a byte buffer (`require_input` checked the datatype).
    buffers = cast("list[bytes]", [tensor.data for tensor in tensors])
    return np.frombuffer(bytearray().join(buffers), dtype=NUMPY_DTYPES[datatype])


def output_rows(
    name: str, values: npt.NDArray[Any], shapes: Sequence[tuple[int, ...]] | None = None
) -> list[dict[str, Tensor]]:
    """`postprocess`'s answer for one numeric output: `values` holds the batch, first
    dimension the items; or, with `shapes`, the items' elements one after another (as
    `joined` gives them), each item of its shape. The batch's bytes are made once and each
    item's tensor is a view of its part."""
    datatype = datatype_of(values.dtype)
    if datatype == BYTES:
        return [{name: Tensor.from_numpy(row)} for row in values]
    data = memoryview(np.ascontiguousarray(values, dtype=NUMPY_DTYPES[datatype]).tobytes())
    if shapes is None:
        step = len(data) // len(values) if len(values) else 0
        row: tuple[int, ...] = values.shape[1:]
        return [
            {name: known_tensor(datatype, row, data[index * step : (index + 1) * step])}
            for index in range(len(values))
        ]
    outputs = []
    start, itemsize = 0, NUMPY_DTYPES[datatype].itemsize
    for shape in shapes:
        end = start + math.prod(shape) * itemsize
        outputs.append({name: known_tensor(datatype, shape, data[start:end])})
        start = end
    return outputs


def check_limits(tensor: Tensor, spec: TensorSpec) -> None:
    """Refuse an item over the limits `spec` declares (`max_elements`, `max_element_bytes`,
    `minimum`, `maximum`).

    The sidecar refuses such requests before it queues them; this guards a model server
    called directly, and `carpool infer`.
    """
    elements: object = tensor.data
    if not isinstance(elements, list) and (spec.minimum, spec.maximum) != (None, None):
        elements = tensor.to_numpy()  # numbers are read only where a range bounds them
    if (error := spec.limit_error(tensor.shape, elements)) is not None:
        raise InvalidItem(error)


def load_handler_class(reference: str) -> type[AnyHandler]:
    """Resolve a built-in short name or `module:Class` to a Handler subclass."""
    target = BUILTIN_HANDLERS.get(reference, reference)
    module_name, _, class_name = target.partition(":")
    if not class_name:
        builtins = ", ".join(BUILTIN_HANDLERS)
        raise ValueError(f"unknown handler {reference!r}: use one of {builtins} or module:Class")
    handler_class = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(handler_class, type) and issubclass(handler_class, Handler)):
        raise ValueError(f"{target!r} is not a carpool Handler subclass")
    return handler_class
