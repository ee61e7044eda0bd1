"""Runs batches through a handler on one dedicated worker thread, preprocess pipelined ahead.

Model work (load, warm-up, forward passes) happens on that one thread, so the event loop
keeps answering health checks and the model never sees two batches at once. The exception
is a lone batch of one item, with the worker idle and no preprocess thread, where the last
item of its kind (`lone_kind`: its inputs' shapes and sizes, and the values of small ones,
such as a token limit) took at most `LOOP_RUN_MAX_S`: it runs on the loop's own thread, which blocks
the loop no longer than about that and spares the wake-up of the worker and the loop's
wake-up back (at one caller, 12 to 30 % of the model server's CPU per batch). When the
handler allows it, `preprocess` runs on a second thread: batch n+1 is tokenized (and copied
to the GPU) while batch n runs; on a pool of one thread per pod CPU where the handler says
its preprocess runs concurrently (`Handler.preprocess_concurrently`). Failures are
isolated per item here: invalid items are answered 400 while their neighbours run; a batch
whose forward pass raises is split in halves and retried until only the failing items
remain, which are answered 500. An error that poisons the device (`fatal.is_fatal`) is not
bisected: it fails the batch and every later one with `DeviceFailed`, until a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

from carpool.contract.wire import BatchTiming, Item, ItemResult, Tensor, answered
from carpool.engine import bisection
from carpool_model_server.errors import DeviceFailed, InferError, InvalidItem
from carpool_model_server.fatal import is_fatal
from carpool_model_server.handler import AnyHandler, Prepared
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.pod_cpus import pod_cpus
from carpool_model_server.warmup import default_sizes
from carpool_model_server.worker_thread import WorkerThread

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
# A lone batch of one item whose kind last ran within this runs on the event loop's thread:
# a health probe, a cancel or a new frame waits at most about this long. Larger batches mean
# load: the next frame is likely waiting, and it would neither be read and decoded while
# this one runs nor have its wait counted as queued (the sidecar would learn a longer hop).
LOOP_RUN_MAX_S = 0.005
# Brief kinds remembered, the oldest forgotten first: what bounds the memory a stream of
# ever-new kinds (text lengths, token limits) can take.
BRIEF_KINDS_KEPT = 1024
# Numeric inputs this small (a token limit, a temperature) key a lone item by their values.
LONE_KIND_VALUE_BYTES = 8
# A batch's results, and when the worker started and finished it (`time.monotonic`).
Measured = tuple[list[ItemResult], float, float]


def lone_kind(item: Item) -> Hashable:
    """What a lone item's run time is taken to depend on: each input's shape and size, and
    the value of a small numeric one. A longer text or another token limit is another kind,
    first run on the worker."""
    return tuple((name, tensor.shape, _size_or_value(tensor.data)) for name, tensor in item.items())


def _size_or_value(data: bytes | memoryview | list[bytes]) -> int | bytes:
    if isinstance(data, list):
        return sum(len(element) for element in data)
    return bytes(data) if len(data) <= LONE_KIND_VALUE_BYTES else len(data)


class Runner:
    def __init__(
        self,
        handler: AnyHandler,
        device: torch.device,
        metrics: ModelMetrics,
        max_batch_size: int,
        warmup_item: Item | None = None,
        pipeline: bool = True,
        prep_threads: int | None = None,
    ) -> None:
        """`warmup_item`, when given, replaces the handler's own example item in warm-up;
        `pipeline` False keeps preprocess on the worker even where the handler allows more;
        `prep_threads` sizes the preprocess pool of a concurrent handler (default: the
        pod's CPUs)."""
        self.handler = handler
        self.device = device
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self._warmup_item = warmup_item
        # Set once, on the worker thread, by the first fatal error; read by the health probe.
        self.failure: str | None = None
        # Every call on the worker runs in inference mode, entered once for the thread: a
        # batch spares entering and leaving it (a few µs when its caches are cold).
        self._worker = WorkerThread("carpool-infer", torch.inference_mode)
        self._preparer: ThreadPoolExecutor | None = None
        self._torch_threads: int | None = None
        # The kinds (`lone_kind`) whose last lone item took at most LOOP_RUN_MAX_S, oldest
        # first; written by the thread that ran the batch (one batch runs at a time).
        self._brief: dict[Hashable, None] = {}
        concurrent = handler.preprocess_concurrently
        if pipeline and handler.preprocess_overlaps_infer:
            threads = (prep_threads or pod_cpus()) if concurrent else 1
            self._preparer = ThreadPoolExecutor(
                max_workers=threads,
                thread_name_prefix="carpool-prep",
                initializer=self._start_prep_thread,
            )
        # The worker preprocesses too (warm-up, isolation): one preprocess at a time, unless
        # the handler runs several at once.
        self._preprocessing: contextlib.AbstractContextManager[object] = (
            contextlib.nullcontext() if concurrent else threading.Lock()
        )

    async def load(
        self,
        torch_threads: int | None,
        warmup_sizes: Sequence[int] | None,
        warmup_seconds: float = math.inf,
    ) -> None:
        """Load the model and run one warm-up batch of each size at each of the handler's
        input shapes, on the worker thread, for `warmup_seconds` at most; None: the sizes
        `warmup.default_sizes` gives for the device."""
        # Read by each preprocess thread as it starts (they start with the first batches).
        self._torch_threads = torch_threads
        sizes = warmup_sizes
        if sizes is None:
            sizes = default_sizes(self.max_batch_size, self.device)
        await self._worker.call(self._load, torch_threads, sizes, warmup_seconds)
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)  # for the batches the loop's thread runs

    async def run(self, items: Sequence[Item]) -> list[ItemResult]:
        """Answer every item, in order; a request above the max batch size runs as several.

        Raises DeviceFailed once the device is unusable.
        """
        return (await self.run_timed(items))[0]

    async def run_timed(self, items: Sequence[Item]) -> tuple[list[ItemResult], BatchTiming]:
        """`run`, and how long the items waited for the worker and then took on it."""
        arrived = time.monotonic()
        if (done := self.run_now(items, arrived)) is not None:
            return done
        results: list[ItemResult] = []
        first_started = last_finished = arrived
        for start in range(0, len(items), self.max_batch_size):
            chunk = items[start : start + self.max_batch_size]
            prepared = None
            if self._preparer is not None:
                prepared = await self._on(self._preparer, self._prepare, chunk)
            answered, started, last_finished = await self._worker.call(
                self._run_measured, chunk, prepared
            )
            results.extend(answered)
            if start == 0:
                first_started = started
        return results, BatchTiming(first_started - arrived, last_finished - first_started)

    def run_later(
        self, items: Sequence[Item], settled: Callable[[asyncio.Future[Measured]], None]
    ) -> asyncio.Future[Measured] | None:
        """The worker's future of a batch it runs in one call (no preprocess thread, at most
        the max batch size): its results, and when the worker started and finished them;
        None for another batch, which `run_timed` takes in steps. Its error is DeviceFailed
        once the device is unusable. `settled` as `WorkerThread.submit` calls it."""
        if self._preparer is not None or len(items) > self.max_batch_size:
            return None
        return self._worker.submit(functools.partial(self._run_measured, items), settled)

    def run_now(
        self, items: Sequence[Item], arrived: float
    ) -> tuple[list[ItemResult], BatchTiming] | None:
        """`run_timed` for a batch that runs on the loop's thread, here and now (a caller
        spares the task and the turn of the loop an await would take); None for one that
        takes the worker. Raises DeviceFailed once the device is unusable."""
        if (kind := self._loop_kind(items)) is None:
            return None
        answered, started, finished = self._run_measured(items, None, kind)
        return answered, BatchTiming(started - arrived, finished - started)

    def _loop_kind(self, items: Sequence[Item]) -> Hashable | None:
        """The kind (`lone_kind`) of a batch that runs on the loop's thread, else None: it
        does when nothing runs or waits on the worker (a batch beside others keeps the
        worker's overlap with the loop), with no preprocess thread, for a handler that may
        run on another thread, and for one item, whose kind last ran briefly."""
        if (
            len(items) != 1
            or not self._worker.idle
            or self._preparer is not None
            or self.handler.one_thread
        ):
            return None
        kind = lone_kind(items[0])
        return kind if kind in self._brief else None

    def _learn(self, kind: Hashable, took: float) -> None:
        """Remember whether a lone item of this kind ran briefly."""
        self._brief.pop(kind, None)
        if took <= LOOP_RUN_MAX_S:
            if len(self._brief) >= BRIEF_KINDS_KEPT:
                del self._brief[next(iter(self._brief))]
            self._brief[kind] = None

    def close(self) -> None:
        """Let the batch in flight finish; batches not started yet are dropped."""
        if self._preparer is not None:
            self._preparer.shutdown(wait=True, cancel_futures=True)
        self._worker.close()

    async def _on(
        self,
        thread: ThreadPoolExecutor,
        function: Callable[P, R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(thread, functools.partial(function, *args, **kwargs))

    def _start_prep_thread(self) -> None:
        if self._torch_threads is not None:
            # OpenMP keeps this setting per thread, as on the worker.
            torch.set_num_threads(self._torch_threads)

    def _prepare(self, items: Sequence[Item]) -> Prepared[object] | None:
        """Preprocess ahead of the worker. None leaves it to the worker: there a failing
        item is isolated (or a fatal error stops the device) as without the pipeline."""
        if self.failure is not None:
            return None
        try:
            return self._preprocess(items)
        except Exception:
            return None

    def _preprocess(self, items: Sequence[Item]) -> Prepared[object]:
        with self._preprocessing, torch.inference_mode():
            prepared: Prepared[object] = self.handler.preprocess(items)
        return prepared

    def _load(
        self, torch_threads: int | None, warmup_sizes: Sequence[int], warmup_seconds: float
    ) -> None:
        if torch_threads is not None:
            # Set on the thread that runs the model: OpenMP keeps this setting per thread.
            torch.set_num_threads(torch_threads)
        started = time.monotonic()
        self.handler.load(self.device)  # in inference mode, as every call on the worker
        log.info("loaded %s in %.2fs", type(self.handler).__name__, time.monotonic() - started)
        examples = self.handler.warmup_items() if self._warmup_item is None else [self._warmup_item]
        if not examples:
            log.info("handler gives no example item and no --example-shape is set: no warm-up")
            return
        self._warm_up(examples, warmup_sizes, warmup_seconds)
        self.metrics.observe_gpu(self.device)

    def _warm_up(self, examples: Sequence[Item], sizes: Sequence[int], seconds: float) -> None:
        """Every size at every example's shape, smallest batches first, until `seconds` have
        passed (the first size runs whatever the time)."""
        begun = time.monotonic()
        for done, size in enumerate(sizes):
            if done and time.monotonic() - begun > seconds:
                log.warning(
                    "warm-up stopped after %.0fs (--warmup-seconds) with %d of %d batch sizes "
                    "run; batches of %d items and more may be slow on their first run",
                    time.monotonic() - begun, done, len(sizes), size,
                )  # fmt: skip
                return
            started = time.monotonic()
            for example in examples:
                results = self._isolate([example] * size)
                failed = [r.error for r in results if r.error is not None]
                if failed:
                    raise RuntimeError(f"warm-up batch of {size} failed: {failed[0]}")
            took = time.monotonic() - started
            if size == 1 and len(examples) == 1:
                self._learn(lone_kind(examples[0]), took)
            log.info(
                "warm-up at batch size %d took %.3fs (input shapes: %d)", size, took, len(examples)
            )

    def _run_measured(
        self,
        items: Sequence[Item],
        prepared: Prepared[object] | None = None,
        kind: Hashable | None = None,
    ) -> Measured:
        """The results, and when the worker started and finished them; `kind`, the lone
        item's when the caller has it."""
        if self.failure is not None:
            raise DeviceFailed(f"the device failed earlier, a restart is pending: {self.failure}")
        started = time.monotonic()
        try:
            results = self._isolate(items, prepared)
        except DeviceFailed:
            self.metrics.observe_batch(len(items), time.monotonic() - started, 0, len(items))
            raise
        finished = time.monotonic()
        if len(items) == 1:
            self._learn(lone_kind(items[0]) if kind is None else kind, finished - started)
        errors = [r.status for r in results if r.error is not None]
        invalid = errors.count(InvalidItem.status)
        failed = len(errors) - invalid
        self.metrics.observe_batch(len(items), finished - started, invalid, failed)
        self.metrics.observe_gpu(self.device)
        return results, started, finished

    def _isolate(
        self, items: Sequence[Item], prepared: Prepared[object] | None = None
    ) -> list[ItemResult]:
        """One forward pass (of `prepared` when given); if it raises, bisect so that only the
        failing items get the error (`carpool.engine.bisection`)."""

        try:  # the common case, without the plan's machinery
            return self._forward(items, prepared)
        except Exception as error:
            known: Exception | None = self._unless_fatal(error)

        def attempt(batch: Sequence[Item]) -> bisection.Outcome[ItemResult]:
            nonlocal known
            if known is not None:  # the whole batch's, run above
                outcome, known = known, None
                return outcome
            try:
                return self._forward(batch, None)
            except Exception as error:
                return self._unless_fatal(error)

        plan = bisection.isolate(
            items,
            failed=_failed,
            # A handler that broke its contract: smaller batches would not mend it.
            splits=lambda error: not isinstance(error, InferError),
        )
        return bisection.run(plan, attempt)

    def _unless_fatal(self, error: Exception) -> Exception:
        """A forward pass's error, to bisect; DeviceFailed, raised, for one that leaves the
        device unusable."""
        if is_fatal(error):
            self.failure = f"{type(error).__name__}: {error}"
            log.critical("the device is unusable until the process restarts", exc_info=error)
            raise DeviceFailed(f"the device failed: {self.failure}") from error
        return error

    def _forward(
        self, items: Sequence[Item], prepared: Prepared[object] | None
    ) -> list[ItemResult]:
        if not torch.is_inference_mode_enabled():  # not on the worker: a lone batch's run
            with torch.inference_mode():
                return self._forward(items, prepared)
        if prepared is None:
            with self._preprocessing:
                prepared = self.handler.preprocess(items)
        accepted_count = len(items) - len(prepared.rejected)
        if prepared.accepted_count != accepted_count:
            raise InferError(
                f"handler preprocess accepted {prepared.accepted_count} items but "
                f"rejected {len(prepared.rejected)} of {len(items)}"
            )
        outputs: list[dict[str, Tensor]] = []
        if prepared.batch is not None and accepted_count:
            outputs = list(self.handler.postprocess(self.handler.infer(prepared.batch)))
        if len(outputs) != accepted_count:
            raise InferError(
                f"handler returned {len(outputs)} results for a batch of {accepted_count} items"
            )
        if not prepared.rejected:
            return list(map(answered, outputs))
        answers = iter(outputs)
        return [
            ItemResult.failed(prepared.rejected[index], InvalidItem.status)
            if index in prepared.rejected
            else ItemResult(outputs=next(answers))
            for index in range(len(items))
        ]


def _failed(error: Exception) -> ItemResult:
    """The result of an item that failed in the model, or of a batch the handler broke."""
    if isinstance(error, InferError):
        return ItemResult.failed(str(error), InferError.status)
    log.warning("item failed in the model: %r", error)
    return ItemResult.failed(
        f"model failed on this item: {type(error).__name__}: {error}", InferError.status
    )
