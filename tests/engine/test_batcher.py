"""The batching engine in-process, with a recording stand-in for the model server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from support.virtual_time import EXACT_S, on_virtual_time, spend

from carpool.contract.wire import Item, ItemResult, Tensor
from carpool.engine.batcher import Batcher
from carpool.engine.errors import (
    BadModelResponse,
    BadRequest,
    DeadlineExceeded,
    PayloadTooLarge,
    QueueFull,
    SidecarError,
    Unavailable,
)
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings

KEY = BatchKey(("x",))


class Model:
    """Echoes each item's value; records batches; `gate` holds batches while cleared."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.drop_one = False
        self.fail: Exception | None = None
        # When set: the sender gives up this long before the time it was given, as a timer
        # that counts whole milliseconds (uvloop's) can.
        self.gives_up_early_s: float | None = None

    async def send(self, items: Sequence[Item], timeout_s: float) -> tuple[list[ItemResult], None]:
        self.batches.append([value(item) for item in items])
        self.started.set()
        if self.gives_up_early_s is not None:
            await asyncio.sleep(timeout_s - self.gives_up_early_s)
            raise Unavailable(f"model server did not answer within {timeout_s:.3f} s")
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        results = [ItemResult(outputs=dict(item)) for item in items]
        return (results[:-1] if self.drop_one else results), None


class Body(dict[str, Tensor]):
    """An item a test can hold a weak reference to."""


def value(item: Item) -> float:
    return float(item["x"].to_numpy()[0])


def items(*values: float) -> list[Item]:
    return [{"x": Tensor.from_numpy(np.array([v], dtype=np.float32))} for v in values]


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.registry = CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry, "m")
        self.model = Model()
        self.batcher = Batcher(
            BatchingSettings(**settings), self.model, self.metrics, asyncio.get_running_loop().time
        )

    def request(
        self,
        *values: float,
        priority: int = 0,
        timeout_s: float = 5.0,
        key: BatchKey = KEY,
        lengths: list[int] | None = None,
        nbytes: int = 0,
    ) -> asyncio.Task[list[ItemResult]]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        submitted = self.batcher.submit(
            items(*values), key, deadline, priority=priority, lengths=lengths, nbytes=nbytes
        )
        return asyncio.create_task(submitted)

    def batches(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "carpool_batches_total", {"model": "m", "reason": reason}
        )
        return value or 0.0

    async def __aenter__(self) -> Harness:
        self.runner = asyncio.create_task(self.batcher.run())
        return self

    async def __aexit__(self, *_: object) -> None:
        self.model.gate.set()
        self.runner.cancel()
        await asyncio.gather(self.runner, return_exceptions=True)


def answers(results: list[ItemResult]) -> list[float]:
    return [value(result.outputs or {}) for result in results]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_lone_request_is_sent_at_once_when_idle() -> None:
    async with Harness(max_wait_ms=10_000) as h:
        result = await asyncio.wait_for(h.request(1.0), 2)
        assert answers(result) == [1.0]
        assert h.batches("idle") == 1 and h.batches("timeout") == 0


async def test_fixed_dispatch_waits_for_the_window() -> None:
    async with Harness(max_wait_ms=50, dispatch="fixed", max_batch_size=8) as h:
        first, second = h.request(1.0), h.request(2.0)
        await asyncio.gather(first, second)
        assert h.model.batches == [[1.0, 2.0]]
        assert h.batches("timeout") == 1


async def test_batch_forms_while_one_runs_and_size_is_never_exceeded() -> None:
    async with Harness(max_batch_size=3, max_wait_ms=10_000, max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        tasks = [h.request(float(v)) for v in range(1, 8)]
        await settle()
        h.model.gate.set()
        results = await asyncio.gather(blocker, *tasks)
        assert [answers(r) for r in results] == [[float(v)] for v in range(8)]
        assert all(len(batch) <= 3 for batch in h.model.batches)
        assert h.model.batches[1] == [1.0, 2.0, 3.0]
        assert h.batches("full") >= 2


async def test_large_request_is_split_and_stitched_in_order() -> None:
    async with Harness(max_batch_size=4) as h:
        values = [float(v) for v in range(10)]
        result = await h.request(*values)
        assert answers(result) == values
        assert [len(batch) for batch in h.model.batches] == [4, 4, 2]


async def test_priority_levels_as_triton_then_fifo() -> None:
    """Level 1 first, then 2, then 5; the default (0, or none) after every level given."""
    async with Harness(max_batch_size=1, max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        tasks = [
            h.request(1.0),
            h.request(2.0, priority=0),
            h.request(3.0, priority=5),
            h.request(4.0, priority=2),
            h.request(5.0, priority=1),
            h.request(6.0, priority=2),
        ]
        await settle()
        h.model.gate.set()
        await asyncio.gather(blocker, *tasks)
        assert h.model.batches == [[0.0], [5.0], [4.0], [6.0], [3.0], [1.0], [2.0]]


async def test_a_priority_outside_tritons_levels_is_refused() -> None:
    """Triton's levels are uint64: past them a level would rank below the default's."""
    async with Harness() as h:
        with pytest.raises(BadRequest, match="'priority' must be >= 0"):
            await h.request(1.0, priority=-1)
        with pytest.raises(BadRequest, match="<= 18446744073709551615, got 18446744073709551616"):
            await h.request(1.0, priority=2**64)
        await h.request(1.0, priority=2**64 - 1)


async def test_queue_full_is_refused_with_retry_after() -> None:
    async with Harness(max_queue_items=2, max_inflight_batches=1, max_batch_size=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        queued = h.request(1.0, 2.0)
        await settle()
        with pytest.raises(QueueFull) as refused:
            await h.request(3.0)
        assert int(refused.value.headers["Retry-After"]) >= 1
        with pytest.raises(PayloadTooLarge):
            await h.request(1.0, 2.0, 3.0)
        h.model.gate.set()
        await asyncio.gather(blocker, queued)


async def test_queue_is_bounded_in_bytes_too() -> None:
    async with Harness(max_queue_bytes=1000, max_inflight_batches=1, max_batch_size=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0, nbytes=1000)  # sent at once: it holds no queue room
        await h.model.started.wait()
        queued = h.request(1.0, nbytes=600)
        await settle()
        with pytest.raises(QueueFull, match="600 bytes"):
            await h.request(2.0, nbytes=500)
        with pytest.raises(PayloadTooLarge, match="maxQueueBytes 1000"):
            await h.request(3.0, nbytes=1001)
        h.model.gate.set()
        await asyncio.gather(blocker, queued)
        # Answered requests give their bytes back.
        assert answers(await h.request(4.0, nbytes=1000)) == [4.0]


async def test_expired_request_is_answered_504_and_never_sent() -> None:
    async with Harness(max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        with pytest.raises(DeadlineExceeded):
            await h.request(1.0, timeout_s=0.05)
        assert h.batcher.queued_items == 0
        h.model.gate.set()
        await blocker
        await settle()
        assert h.model.batches == [[0.0]]


async def test_a_deadline_is_a_deadline_in_a_task_that_once_swallowed_a_cancellation() -> None:
    """A server task that caught a cancellation earlier (without `uncancel`) still gets 504
    when its request's deadline passes, not a cancellation read as a client gone."""
    async with Harness(max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()

        async def handler() -> None:
            this = asyncio.current_task()
            assert this is not None
            this.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)
            deadline = asyncio.get_running_loop().time() + 0.05
            await h.batcher.submit(items(1.0), KEY, deadline)

        with pytest.raises(DeadlineExceeded):
            await asyncio.create_task(handler())
        h.model.gate.set()
        await blocker


@on_virtual_time
async def test_a_batch_past_its_callers_deadline_is_504_though_the_senders_timer_is_early() -> None:
    """The sender's timer may count whole milliseconds (uvloop's do) and fire a millisecond
    before the time it was given: the batch's callers still hear 504 for the deadline they
    set, not 503 for a model server that did not answer."""
    async with Harness() as h:
        h.model.gives_up_early_s = 0.001
        with pytest.raises(DeadlineExceeded):
            await h.request(1.0, timeout_s=0.1)
        assert h.model.batches == [[1.0]]


async def test_cancelled_request_is_dropped_before_the_model() -> None:
    async with Harness(max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        gone = h.request(1.0)
        kept = h.request(2.0)
        await settle()
        gone.cancel()
        await settle()
        h.model.gate.set()
        await asyncio.gather(blocker, kept)
        assert h.model.batches == [[0.0], [2.0]]
        assert h.batcher.queued_items == 0


async def test_failure_reaches_every_waiter() -> None:
    async with Harness(max_wait_ms=50, dispatch="fixed") as h:
        h.model.fail = Unavailable("model server unreachable")
        tasks = [h.request(1.0), h.request(2.0, 3.0)]
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            assert isinstance(outcome, Unavailable)


async def test_wrong_result_count_names_both_numbers() -> None:
    async with Harness() as h:
        h.model.drop_one = True
        with pytest.raises(BadModelResponse, match="1 results for 2 items"):
            await h.request(1.0, 2.0)


async def test_token_budget_and_padding_ratio() -> None:
    async with Harness(max_batch_size=64, max_batch_tokens=32, max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        bucket = BatchKey(("text",), bucket=8)
        tasks = [h.request(float(v), key=bucket, lengths=[8 if v % 2 else 4]) for v in range(1, 9)]
        await settle()
        h.model.gate.set()
        await asyncio.gather(blocker, *tasks)
        # 32 tokens / bucket 8 = 4 items per batch.
        assert [len(batch) for batch in h.model.batches] == [1, 4, 4]
        # Each batch: lengths 8,4,8,4 pad to 8: 32 / 24 - 1.
        count = h.registry.get_sample_value("carpool_batch_padding_ratio_count", {"model": "m"})
        total = h.registry.get_sample_value("carpool_batch_padding_ratio_sum", {"model": "m"})
        assert count == 2 and total == pytest.approx(2 * (32 / 24 - 1))


async def test_incompatible_items_never_share_a_batch() -> None:
    async with Harness(max_wait_ms=50, dispatch="fixed") as h:
        await asyncio.gather(h.request(1.0), h.request(2.0, key=BatchKey(("y",))), h.request(3.0))
        assert sorted(h.model.batches) == [[1.0, 3.0], [2.0]]


async def test_new_settings_apply_to_the_next_batch() -> None:
    async with Harness(max_batch_size=2) as h:
        await h.request(*[float(v) for v in range(4)])
        h.batcher.update(BatchingSettings(max_batch_size=4))
        await h.request(*[float(v) for v in range(4)])
        assert [len(batch) for batch in h.model.batches] == [2, 2, 4]


async def test_drain_sends_everything_then_refuses() -> None:
    async with Harness(max_wait_ms=10_000, dispatch="fixed", max_batch_size=8) as h:
        tasks = [h.request(float(v)) for v in range(5)]
        await settle()
        assert await h.batcher.drain(2.0)
        assert [answers(r) for r in await asyncio.gather(*tasks)] == [[float(v)] for v in range(5)]
        assert h.batches("drain") == 1
        with pytest.raises(Unavailable):
            await h.request(9.0)


@on_virtual_time
async def test_next_batch_waits_for_the_window_while_one_runs() -> None:
    async with Harness(max_wait_ms=50, max_batch_size=8, max_inflight_batches=2) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        second = h.request(1.0)
        await settle()
        await asyncio.sleep(0.049)
        assert len(h.model.batches) == 1  # held: a batch is running and this one is not full
        await asyncio.sleep(0.002)
        assert h.model.batches == [[0.0], [1.0]]  # sent as its 50 ms window closed
        h.model.gate.set()
        await asyncio.gather(blocker, second)
        assert h.batches("idle") == 1 and h.batches("timeout") == 1


@on_virtual_time
async def test_inflight_batches_are_capped() -> None:
    async with Harness(max_batch_size=1, max_inflight_batches=2) as h:
        h.model.gate.clear()
        tasks = [h.request(float(v)) for v in range(4)]
        await asyncio.sleep(0.05)
        assert len(h.model.batches) == 2
        inflight = h.registry.get_sample_value("carpool_inflight_batches", {"model": "m"})
        assert inflight == 2
        h.model.gate.set()
        await asyncio.gather(*tasks)
        assert len(h.model.batches) == 4


async def test_stopping_the_dispatcher_answers_callers_of_a_running_batch_503() -> None:
    async with Harness() as h:
        h.model.gate.clear()
        caller = h.request(1.0, timeout_s=30.0)
        await h.model.started.wait()
        h.runner.cancel()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(caller, 2)  # not at its 30 s deadline


async def test_abort_answers_queued_and_running_callers_503() -> None:
    async with Harness(max_inflight_batches=1) as h:
        h.model.gate.clear()
        running = h.request(1.0, timeout_s=30.0)
        await h.model.started.wait()
        queued = h.request(2.0, timeout_s=30.0)
        await settle()
        await asyncio.wait_for(h.batcher.abort(), 2)
        for caller in (running, queued):
            with pytest.raises(Unavailable):
                await caller
        with pytest.raises(Unavailable):
            await h.request(3.0)
        assert h.model.batches == [[1.0]]


async def test_requests_that_leave_the_queue_are_freed() -> None:
    async with Harness(max_inflight_batches=1) as h:
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        loop = asyncio.get_running_loop()
        kept = h.request(9.0)
        left: list[weakref.ref[Body]] = []
        for key in (KEY, BatchKey(("other",))):  # beside a waiting request, and alone
            for _ in range(3):
                body = Body(items(1.0)[0])
                task = asyncio.create_task(h.batcher.submit([body], key, loop.time() + 5))
                await settle()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                left.append(weakref.ref(body))
                del body, task
        await settle()
        gc.collect()
        alive = [ref() is not None for ref in left]
        # Alone: freed with their group. Beside a waiting request: freed once they outnumber
        # the items still waiting, so at most that many linger.
        assert alive[3:] == [False] * 3 and sum(alive[:3]) <= 1
        wait_count = h.registry.get_sample_value("carpool_queue_wait_seconds_count", {"model": "m"})
        assert wait_count == 1 + 6  # the blocker when sent, each leaver when it left
        h.model.gate.set()
        await asyncio.gather(blocker, kept)
        assert h.model.batches == [[0.0], [9.0]]


async def test_failed_batches_do_not_count_as_throughput() -> None:
    async with Harness(max_queue_items=40, max_batch_size=1, max_inflight_batches=1) as h:
        h.model.fail = Unavailable("model server unreachable")
        failures = await asyncio.gather(
            *(h.request(1.0) for _ in range(20)), return_exceptions=True
        )
        assert all(isinstance(failure, Unavailable) for failure in failures)
        h.model.fail = None
        h.model.started.clear()
        h.model.gate.clear()
        blocker = h.request(0.0)
        await h.model.started.wait()
        queued = h.request(*[1.0] * 40)
        await settle()
        with pytest.raises(QueueFull) as refused:
            await h.request(2.0)
        # Nothing answered yet: no throughput to promise a drain time from.
        assert refused.value.headers["Retry-After"] == "1"
        h.model.gate.set()
        await asyncio.gather(blocker, queued)


async def test_a_bug_in_sending_is_500_without_its_details() -> None:
    async with Harness() as h:
        h.model.fail = RuntimeError("secret internals")
        with pytest.raises(SidecarError) as failed:
            await h.request(1.0)
        assert failed.value.status == 500 and "secret" not in failed.value.message


async def turns_until(condition: Callable[[], bool]) -> int:
    """Turns of the event loop until `condition` holds (at most 10)."""
    for turn in range(10):
        if condition():
            return turn
        await asyncio.sleep(0)
    raise AssertionError("not within 10 turns of the loop")


async def test_a_queued_request_leaves_on_the_next_turn_after_the_model_frees() -> None:
    async with Harness(max_wait_ms=10_000, max_inflight_batches=1) as h:
        h.model.gate.clear()
        first = h.request(1.0)
        await h.model.started.wait()
        second = h.request(2.0)
        await settle()
        h.model.gate.set()
        # The answer wakes the batch's task, which sends the next batch before it ends rather
        # than waking the dispatcher: on a busy sidecar every turn of the loop waits behind
        # whatever else is ready.
        assert await turns_until(lambda: len(h.model.batches) == 2) <= 2
        await asyncio.gather(first, second)


async def test_a_batch_is_written_before_the_dispatcher_forms_the_next() -> None:
    """Two full batches at once: the first goes to the model before the second is formed,
    rather than after it."""
    async with Harness(max_batch_size=2, max_inflight_batches=2, max_wait_ms=10_000) as h:
        queued_at_send: list[int] = []
        send = h.model.send

        async def counting(
            items: Sequence[Item], timeout_s: float
        ) -> tuple[list[ItemResult], None]:
            queued_at_send.append(h.batcher.queued_items)
            return await send(items, timeout_s)

        h.model.send = counting  # type: ignore[method-assign]
        await asyncio.gather(*(h.request(float(v)) for v in range(4)))
        # The second batch's items were still queued as the first was sent.
        assert queued_at_send == [2, 0]


async def test_a_lone_caller_is_answered_before_its_batch_is_learned() -> None:
    """With no one queued for the model, the batch's time is learned after its callers'
    answers are on their way, not before: at one caller, off every request's path."""
    async with Harness(max_wait_ms=10_000) as h:
        deadline = asyncio.get_running_loop().time() + 5
        result = await h.batcher.submit(items(1.0), KEY, deadline)
        learned = h.registry.get_sample_value(
            "carpool_model_duration_seconds_count", {"model": "m"}
        )
        assert answers(result) == [1.0] and not learned
        await settle()
        learned = h.registry.get_sample_value(
            "carpool_model_duration_seconds_count", {"model": "m"}
        )
        assert learned == 1


@on_virtual_time
async def test_the_model_time_learned_leaves_out_the_callers_turn() -> None:
    """The callers answered first may hold the loop a while (writing their answers); the
    batch's time at the model does not grow by it."""
    async with Harness(max_wait_ms=10_000) as h:
        deadline = asyncio.get_running_loop().time() + 5
        await h.batcher.submit(items(1.0), KEY, deadline)
        spend(0.05)  # the caller holds the loop in its turn
        await settle()
        took = h.registry.get_sample_value("carpool_model_duration_seconds_sum", {"model": "m"})
        assert took is not None and took < EXACT_S
