"""A lone batch of one item that last ran briefly runs on the event loop's thread (no
hand-off to the worker and back); a slow one, one not seen yet, one of several items or one
beside another batch runs on the worker, so the loop stays responsive and the model sees
one batch at a time; so does every batch of a handler that says it is bound to one thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from carpool.contract.wire import Item, Tensor
from carpool_model_server import runner as runner_module
from carpool_model_server.handler import HandlerSettings, Prepared
from carpool_model_server.handler_stand_in import Rows, StandInHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner, lone_kind

# How long a held forward pass waits for the test to let it go: it is let go within
# milliseconds, unless its thread is the one the test runs on.
HOLD_S = 5.0


@pytest.fixture(autouse=True)
def brief_on_any_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run is brief up to 200 ms here, not 5: the brief runs of these tests take 0.5 ms and
    the slow ones 400 ms, and a loaded machine's thread may get to a run late, never early."""
    monkeypatch.setattr(runner_module, "LOOP_RUN_MAX_S", 0.2)


class Recording(StandInHandler):
    """The stand-in; records the thread of each forward pass and any overlap of two, and
    holds a pass while `go` is clear, until the test sets it."""

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.threads: list[int] = []
        self.running = 0
        self.overlapped = False
        self.go = threading.Event()
        self.go.set()
        self.held = threading.Event()  # a pass waits for `go`
        self.waited_out = False  # a held pass went on after HOLD_S, not let go

    def infer(self, batch: Rows) -> Rows:
        self.threads.append(threading.get_ident())
        self.running += 1
        self.overlapped |= self.running > 1
        try:
            if not self.go.is_set():
                self.held.set()
                self.waited_out |= not self.go.wait(HOLD_S)
            return super().infer(batch)
        finally:
            self.running -= 1


class OneThread(Recording):
    one_thread = True


def make_runner(fixed_ms: float, kind: type[Recording] = Recording) -> tuple[Runner, Recording]:
    handler = kind(HandlerSettings(None, torch.float32, 8, {"fixed_ms": str(fixed_ms)}))
    return Runner(handler, torch.device("cpu"), ModelMetrics.create("stand-in"), 8), handler


def items(count: int, width: int = 4) -> list[Item]:
    return [{"input": Tensor.from_numpy(np.full(width, i, dtype=np.float32))} for i in range(count)]


async def held_batch_started(runner: Runner, handler: Recording) -> asyncio.Task[object]:
    """A batch of a size not seen yet, started on the worker and held there until the test
    sets `handler.go`."""
    handler.go.clear()
    batch = asyncio.create_task(runner.run(items(3)))
    assert await asyncio.to_thread(handler.held.wait, HOLD_S)
    return batch


async def beside(runner: Runner, handler: Recording) -> None:
    """A lone batch of a brief size while a held one runs: it is sent, then the held one is
    let go."""
    lone = asyncio.create_task(runner.run(items(1)))
    await asyncio.sleep(0)  # it goes to the worker, or runs, in its first step
    handler.go.set()
    assert (await lone)[0].outputs is not None


async def test_a_lone_brief_batch_of_one_runs_on_the_loop_thread_once_seen_brief() -> None:
    runner, handler = make_runner(fixed_ms=0.5)
    await runner.run(items(1))  # not seen yet: the worker
    await runner.load(1, [1, 2])  # warm-up runs each size on the worker: brief
    try:
        results = await runner.run(items(1))
        await runner.run(items(2))  # two items: the worker, however brief
    finally:
        runner.close()
    loop_thread = threading.get_ident()
    assert results[0].outputs is not None
    assert [t == loop_thread for t in handler.threads] == [False, False, False, True, False]


async def test_every_step_runs_in_inference_mode_on_either_thread_and_the_loop_leaves_it() -> None:
    """The worker enters inference mode once for its thread; a lone batch on the loop's
    thread enters it for its run alone."""
    modes: list[tuple[str, bool, bool]] = []

    class Modes(Recording):
        def load(self, device: torch.device) -> None:
            modes.append(("load", threading.get_ident() == loop, torch.is_inference_mode_enabled()))

        def preprocess(self, batch: Sequence[Item]) -> Prepared[Rows]:
            step = ("preprocess", threading.get_ident() == loop, torch.is_inference_mode_enabled())
            modes.append(step)
            return super().preprocess(batch)

        def postprocess(self, outputs: Rows) -> list[dict[str, Tensor]]:
            step = ("postprocess", threading.get_ident() == loop, torch.is_inference_mode_enabled())
            modes.append(step)
            return super().postprocess(outputs)

    loop = threading.get_ident()
    runner, handler = make_runner(fixed_ms=0.5, kind=Modes)
    try:
        await runner.load(1, [1])  # on the worker; learns the lone kind brief
        assert modes[0] == ("load", False, True) and all(mode for _, _, mode in modes)
        modes.clear()
        await runner.run(items(1))  # the loop's thread
        await runner.run(items(2))  # the worker
    finally:
        runner.close()
    assert [t == loop for t in handler.threads] == [False, True, False]
    assert modes == [
        ("preprocess", True, True),
        ("postprocess", True, True),
        ("preprocess", False, True),
        ("postprocess", False, True),
    ]
    assert not torch.is_inference_mode_enabled()


async def test_the_loop_stays_responsive_while_a_slow_lone_batch_runs() -> None:
    runner, handler = make_runner(fixed_ms=400)
    await runner.load(1, [1])  # learns that a batch of one takes 400 ms
    handler.go.clear()
    try:
        batch = asyncio.create_task(runner.run(items(1)))
        await asyncio.sleep(0)  # the batch starts
        # As a health probe's handler would: the loop runs it while the batch is held.
        await asyncio.sleep(0.01)
        handler.go.set()
        assert (await batch)[0].outputs is not None
    finally:
        runner.close()
    assert not handler.waited_out
    assert threading.get_ident() not in handler.threads


async def test_a_batch_beside_another_in_flight_waits_for_the_worker() -> None:
    runner, handler = make_runner(fixed_ms=0.5)
    await runner.load(1, [1])
    try:
        first = await held_batch_started(runner, handler)
        await beside(runner, handler)  # a brief size, not to run beside it
        await first
    finally:
        runner.close()
    assert not handler.overlapped and not handler.waited_out
    assert threading.get_ident() not in handler.threads[1:]


async def test_a_cancelled_caller_leaves_its_batch_running_on_the_worker() -> None:
    """Cancelling the caller does not free the model: the next lone batch waits its turn."""
    runner, handler = make_runner(fixed_ms=0.5)
    await runner.load(1, [1])
    try:
        first = await held_batch_started(runner, handler)
        first.cancel()
        await asyncio.wait([first])  # its caller is gone; its batch still runs
        assert first.cancelled()
        await beside(runner, handler)
    finally:
        runner.close()
    assert not handler.overlapped and not handler.waited_out


async def test_a_handler_bound_to_one_thread_runs_every_batch_on_the_worker() -> None:
    runner, handler = make_runner(fixed_ms=0.5, kind=OneThread)
    await runner.load(1, [1])
    try:
        for _ in range(3):
            await runner.run(items(1))
    finally:
        runner.close()
    assert len(set(handler.threads)) == 1 and threading.get_ident() not in handler.threads


async def test_a_lone_item_of_another_kind_runs_on_the_worker_first() -> None:
    """A longer input (or another token limit) may take far longer than the brief item seen:
    its first run is on the worker, and the loop's thread takes it once it was brief."""
    runner, handler = make_runner(fixed_ms=0.5)
    try:
        await runner.run(items(1))  # learned brief
        await runner.run(items(1))  # the loop
        await runner.run(items(1, width=64))  # another kind: the worker
        await runner.run(items(1, width=64))  # seen brief: the loop
    finally:
        runner.close()
    loop_thread = threading.get_ident()
    assert [t == loop_thread for t in handler.threads] == [False, True, False, True]


def test_a_lone_items_kind_holds_its_sizes_and_its_small_values() -> None:
    def prompt(text: bytes, limit: int) -> Item:
        return {
            "text_input": Tensor("BYTES", (1,), [text]),
            "max_new_tokens": Tensor.from_numpy(np.array([limit], dtype=np.int32)),
        }

    assert lone_kind(prompt(b"hello", 4)) == lone_kind(prompt(b"world", 4))
    assert lone_kind(prompt(b"hello", 4)) != lone_kind(prompt(b"hello", 400))
    assert lone_kind(prompt(b"hello", 4)) != lone_kind(prompt(b"hello there", 4))


async def test_the_brief_kinds_remembered_are_bounded_the_oldest_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner_module, "BRIEF_KINDS_KEPT", 2)
    runner, handler = make_runner(fixed_ms=0.5)
    try:
        for width in (4, 8, 16):  # each learned brief on the worker; the first then forgotten
            await runner.run(items(1, width=width))
        await runner.run(items(1, width=16))  # still remembered: the loop
        await runner.run(items(1, width=4))  # forgotten: the worker again
    finally:
        runner.close()
    loop_thread = threading.get_ident()
    assert [t == loop_thread for t in handler.threads] == [False, False, False, True, False]
