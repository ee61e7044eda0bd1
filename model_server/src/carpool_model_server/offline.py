"""Offline batch inference: a handler run in process over a list of items.

Items are sorted by length and cut into batches of neighbours, so each batch pads only to a
length close to its own items'; the longest batches run first, so a batch too large for
memory fails at once rather than at the end. Results keep the items' order. The handler runs
on the model server's own `Runner`, so a failing item is isolated exactly as in serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from carpool.contract.wire import Item, ItemResult, Tensor
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    AnyHandler,
    Handler,
    HandlerSettings,
    Prepared,
    load_handler_class,
)
from carpool_model_server.items import Record, files_size, item_from_record, item_length
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner

DEFAULT_BATCH_SIZE = 32


@dataclass(slots=True)
class Stats:
    """What a run did: counts, time, and how much of the model's work was padding."""

    items: int = 0
    batches: int = 0
    seconds: float = 0.0
    real_tokens: int = 0  # token slots that held data
    padded_slots: int = 0  # all token slots of every batch, padding included

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0

    @property
    def padding_ratio(self) -> float:
        """Padding slots per real slot, as the sidecar's carpool_padding_ratio counts them."""
        return self.padded_slots / self.real_tokens - 1 if self.real_tokens else 0.0

    def summary(self) -> str:
        mean = self.items / self.batches if self.batches else 0.0
        return (
            f"{self.items} items in {self.seconds:.2f}s: {self.items_per_second:.1f} items/s, "
            f"{self.batches} batches (mean {mean:.1f} items), "
            f"padding ratio {self.padding_ratio:.3f}"
        )


def plan(lengths: Sequence[int], batch_size: int, sort_by_length: bool) -> list[list[int]]:
    """Batches of item indices: neighbours by length, longest batch first; else input order."""
    order = list(range(len(lengths)))
    if sort_by_length:
        order.sort(key=lambda index: lengths[index], reverse=True)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class BatchInference:
    """A loaded handler that answers batches of records; use as a context manager.

    `handler` is a built-in name (`text-embedding`), `module:Class`, or a Handler instance
    not yet loaded.
    """

    def __init__(
        self,
        handler: str | AnyHandler,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        model_path: Path | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        torch_threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> None:
        """`options`: the handler's own settings, as `--handler-options` gives them."""
        if isinstance(handler, str):
            settings = HandlerSettings(model_path, dtype, batch_size, dict(options or {}))
            handler = load_handler_class(handler)(settings)
        self.handler = handler
        self.batch_size = batch_size
        self.stats = Stats()
        self._measured = _PaddingMeter(handler, self.stats)
        self._runner = Runner(
            self._measured, torch.device(device), ModelMetrics.create("offline"), batch_size
        )
        self._loop = asyncio.Runner()
        self._loop.run(self._runner.load(torch_threads, ()))

    def __enter__(self) -> BatchInference:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def reset_stats(self) -> None:
        """Count from zero again, e.g. between benchmark rounds."""
        self.stats = self._measured.stats = Stats()

    def close(self) -> None:
        self._runner.close()
        self._loop.close()

    def run(
        self, records: Sequence[Record], *, sort_by_length: bool = True, base: Path | None = None
    ) -> Iterator[tuple[list[int], list[ItemResult]]]:
        """Yield (indices, results) batch by batch; every index of `records` exactly once.
        `{"file": PATH}` values are read relative to `base` (the working folder if None)."""
        inputs = self.handler.metadata.inputs
        # A handler may measure items in its own tokens; else bytes of text stand in for them.
        measure = getattr(self.handler, "item_length", item_length)
        # Each record's item, or the message refusing it; None for a record naming files:
        # they are read when its batch runs (a run holds one batch of images, not all of
        # them), and their size is its length.
        items: list[Item | str | None] = []
        lengths: list[int] = []
        for record in records:
            size = files_size(record, inputs, base)
            if size is None:
                item = self._item(record, base)
                size = 0 if isinstance(item, str) else int(measure(item))
                items.append(item)
            else:
                items.append(None)
            lengths.append(size)
        for indices in plan(lengths, self.batch_size, sort_by_length):
            batch = [
                self._item(records[i], base) if (ready := items[i]) is None else ready
                for i in indices
            ]
            yield indices, self._run_batch(batch)

    def _item(self, record: Record, base: Path | None) -> Item | str:
        """The record's item, or the message refusing it."""
        try:
            return item_from_record(record, self.handler.metadata.inputs, base)
        except InvalidItem as error:
            return str(error)

    def _run_batch(self, items: list[Item | str]) -> list[ItemResult]:
        valid = [item for item in items if not isinstance(item, str)]
        started = time.monotonic()
        answers = iter(self._loop.run(self._runner.run(valid)) if valid else [])
        self.stats.seconds += time.monotonic() - started
        self.stats.items += len(items)
        self.stats.batches += 1
        return [
            ItemResult.failed(item, InvalidItem.status) if isinstance(item, str) else next(answers)
            for item in items
        ]


def batch_inference(
    handler: str | AnyHandler,
    items: Iterable[Record],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    sort_by_length: bool = True,
    model_path: Path | None = None,
    device: str = "cpu",
    torch_threads: int | None = None,
) -> list[ItemResult]:
    """Run `handler` over `items` in batches; one result per item, in the items' order.

    Items are JSON-like records (`{"text": "..."}`, or a bare string for a text first input) or
    maps of Tensors. A refused or failing item gets its error in its result; the rest run.
    """
    records = list(items)
    results: list[ItemResult] = [ItemResult.failed("not run", 500)] * len(records)
    with BatchInference(
        handler,
        batch_size=batch_size,
        model_path=model_path,
        device=device,
        torch_threads=torch_threads,
    ) as inference:
        for indices, answers in inference.run(records, sort_by_length=sort_by_length):
            for index, answer in zip(indices, answers, strict=True):
                results[index] = answer
    return results


class _PaddingMeter(Handler[Any, Any]):
    """The handler itself, counting the padding of every batch it builds into `stats`.

    A batch tells its padding by a `padding()` method returning (real, slots), as the
    text-generation handler's does, or by an `attention_mask`, as tokenized batches carry.
    For other batches every item counts as its `item_length`, padded to the batch's longest.
    """

    def __init__(self, inner: AnyHandler, stats: Stats) -> None:
        # The inner handler checked its options; the meter takes none of its own.
        super().__init__(dataclasses.replace(inner.settings, options={}))
        self.settings = inner.settings
        self.inner = inner
        self.metadata = inner.metadata
        self.one_thread = inner.one_thread  # type: ignore[misc]
        self.stats = stats

    def load(self, device: torch.device) -> None:
        self.inner.load(device)
        self.metadata = self.inner.metadata  # a handler may bound it from what it loaded

    def preprocess(self, items: Sequence[Item]) -> Prepared[Any]:
        prepared = self.inner.preprocess(items)
        real, slots = _padding(prepared.batch, items, prepared.rejected)
        self.stats.real_tokens += real
        self.stats.padded_slots += slots
        return prepared

    def infer(self, batch: Any) -> Any:
        return self.inner.infer(batch)

    def postprocess(self, outputs: Any) -> list[dict[str, Tensor]]:
        return self.inner.postprocess(outputs)

    def example_item(self) -> Item | None:
        return self.inner.example_item()


def _padding(batch: Any, items: Sequence[Item], rejected: dict[int, str]) -> tuple[int, int]:
    if batch is None:
        return 0, 0
    padding = getattr(batch, "padding", None)
    if callable(padding):
        real, slots = padding()
        return int(real), int(slots)
    mask = getattr(batch, "attention_mask", None)
    if isinstance(mask, torch.Tensor):
        return int(mask.sum()), mask.numel()
    lengths = [item_length(item) for i, item in enumerate(items) if i not in rejected]
    return sum(lengths), len(lengths) * max(lengths, default=0)
