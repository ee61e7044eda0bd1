"""Generate requests to a model server that batches tokens itself: admission to places in
its running batch, then priority order, the queue bound and deadlines; and the answer
budget that the pieces of slowly read streams are charged to."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sidecar.test_frame_client import frame_server, read_frame, write_frame

from carpool.contract import frames, wire
from carpool.contract.generation import GENERATED_TOKENS, TEXT_INPUT, TEXT_OUTPUT
from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.wire import BYTES, ItemResult, Tensor
from carpool.engine.batcher import Batcher
from carpool.engine.errors import DeadlineExceeded, PayloadTooLarge, QueueFull, Unavailable
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.answers import AnswerBudget
from carpool_sidecar.client import ModelClient
from carpool_sidecar.dataplane import DataPlane
from carpool_sidecar.forwarder import ModelServerForwarder
from carpool_sidecar.generation import GenerateRequest
from carpool_sidecar.health import ModelState
from carpool_sidecar.streaming import Admission, GenerationMetrics, Streams

LIMIT = 2


def admission() -> tuple[Admission, CollectorRegistry]:
    registry = CollectorRegistry()
    return Admission(GenerationMetrics(registry, "m")), registry


def metric(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"model": "m"})


async def test_waiters_get_places_by_priority_level_then_arrival() -> None:
    places, registry = admission()
    order: list[str] = []
    release = asyncio.Event()

    async def caller(name: str, priority: int) -> None:
        async with places.place(priority, asyncio.get_running_loop().time() + 10, LIMIT, 8):
            order.append(name)
            await release.wait()

    running = [asyncio.create_task(caller(f"run{n}", 0)) for n in range(LIMIT)]
    await asyncio.sleep(0)
    waiting = []
    for name, priority in [("default", 0), ("second", 2), ("first", 1), ("second-b", 2)]:
        waiting.append(asyncio.create_task(caller(name, priority)))
        await asyncio.sleep(0)
    assert metric(registry, "carpool_generation_running_streams") == LIMIT
    assert metric(registry, "carpool_generation_waiting_streams") == 4
    release.set()
    await asyncio.gather(*running, *waiting)
    assert order == ["run0", "run1", "first", "second", "second-b", "default"]
    assert metric(registry, "carpool_generation_running_streams") == 0
    assert metric(registry, "carpool_generation_waiting_streams") == 0


async def test_the_queue_is_bounded_and_waiting_has_a_deadline() -> None:
    places, registry = admission()
    loop = asyncio.get_running_loop()
    hold = asyncio.Event()

    async def holder() -> None:
        async with places.place(0, loop.time() + 10, 1, 1):
            await hold.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    patient = asyncio.create_task(holder())
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        async with places.place(0, loop.time() + 10, 1, 1):
            pass
    patient.cancel()  # a caller who leaves gives up its place in the queue
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded):
        async with places.place(0, loop.time() + 0.05, 1, 1):
            pass
    hold.set()
    await held
    async with places.place(0, loop.time() + 10, 1, 1):
        assert metric(registry, "carpool_generation_running_streams") == 1
    assert metric(registry, "carpool_generation_waiting_streams") == 0


GENERATES = ModelMetadata(
    name="m",
    platform="test",
    inputs=(TensorSpec(TEXT_INPUT, BYTES, (1,)),),
    outputs=(TensorSpec(TEXT_OUTPUT, BYTES, (1,)),),
    max_batch_size=8,
    streams_tokens=True,
)
PIECE = "x" * 1000
PIECES = 20


def text_frame(text: str) -> bytes:
    return wire.encode_response(
        [ItemResult(outputs={TEXT_OUTPUT: Tensor(BYTES, (1,), [text.encode()])})]
    )


async def stream_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every stream frame with all its pieces at once, then the whole text."""
    while True:
        request_id, code, _ = await read_frame(reader)
        if code == frames.STREAM:
            for _ in range(PIECES):
                write_frame(writer, request_id, frames.PART, text_frame(PIECE))
            write_frame(writer, request_id, frames.OK, text_frame(PIECE * PIECES))


def streaming_plane(
    client: ModelClient, budget: AnswerBudget, registry: CollectorRegistry | None = None
) -> DataPlane:
    """A data plane for a model that streams tokens, through `client`; its generation
    metrics in `registry`."""
    batcher = Batcher(
        BatchingSettings(max_queue_items=8),
        ModelServerForwarder(client, ModelState()),
        SidecarMetrics(CollectorRegistry(), "m"),
    )
    state = ModelState()
    state.ready, state.metadata = True, GENERATES
    streams = Streams(client, GenerationMetrics(registry or CollectorRegistry(), "m"))
    return DataPlane("m", batcher, state, budget, streams)


async def test_an_answer_past_the_answer_limit_is_413_streamed_or_not(tmp_path: Path) -> None:
    """A caller who asks for more text than an answer may hold is told so (413, as from a
    model server that batches whole requests): the model server did nothing wrong."""
    http_socket = tmp_path / "model.sock"
    client = ModelClient(f"unix://{http_socket}")
    plane = streaming_plane(client, AnswerBudget(2**20, 2**20))
    async with frame_server(Path(frames.socket_for(http_socket)), stream_at_once):
        try:
            now = asyncio.get_running_loop().time()
            with pytest.raises(PayloadTooLarge, match="10000"):
                await plane.generate(GenerateRequest("prompt"), None, now, 10_000)
            pieces = plane.generate_stream(GenerateRequest("prompt"), None, now, 10_000)
            try:
                with pytest.raises(PayloadTooLarge, match="10000"):
                    async for piece in pieces:
                        assert piece.text == PIECE
            finally:
                await pieces.aclose()
        finally:
            await client.close()


async def answer_batches_whole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every batch of one prompt with its whole text and the tokens it took."""
    while True:
        request_id, code, _ = await read_frame(reader)
        assert code == frames.BATCH
        outputs = {
            TEXT_OUTPUT: Tensor(BYTES, (1,), [(PIECE * PIECES).encode()]),
            GENERATED_TOKENS: Tensor.from_numpy(np.array([PIECES], np.int32)),
        }
        write_frame(writer, request_id, frames.OK, wire.encode_response([ItemResult(outputs)]))


async def test_a_whole_answer_refused_for_its_size_counts_no_tokens(tmp_path: Path) -> None:
    """Tokens generated for an answer that is refused (413) are not counted as served."""
    http_socket = tmp_path / "model.sock"
    client = ModelClient(f"unix://{http_socket}")
    registry = CollectorRegistry()
    plane = streaming_plane(client, AnswerBudget(2**20, 2**20), registry)
    plane.state.metadata = dataclasses.replace(GENERATES, streams_tokens=False)
    batching = asyncio.create_task(plane.batcher.run())
    async with frame_server(Path(frames.socket_for(http_socket)), answer_batches_whole):
        try:
            now = asyncio.get_running_loop().time()
            with pytest.raises(PayloadTooLarge, match="10000"):
                await plane.generate(GenerateRequest("prompt"), None, now, 10_000)
            assert metric(registry, "carpool_generation_tokens_total") == 0
            answer = await plane.generate(GenerateRequest("prompt"), None, now, 2**20)
            assert answer.text_output == PIECE * PIECES
            assert metric(registry, "carpool_generation_tokens_total") == PIECES
        finally:
            batching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batching
            await client.close()


async def test_the_pieces_slow_readers_leave_unread_hold_no_more_than_the_budget(
    tmp_path: Path,
) -> None:
    """Six streams of 40 kB each (20 pieces, then the whole text), whose callers take one
    piece and then stop reading, against 60 kB of room for unsent answers: the pieces
    waiting in the sidecar never hold more, the streams that found no room are cut (503),
    the others are whole once read, and every byte is given back at the end."""
    budget = AnswerBudget(2**20, 60_000)
    http_socket = tmp_path / "model.sock"
    client = ModelClient(f"unix://{http_socket}")
    plane = streaming_plane(client, budget)
    read_on = asyncio.Event()
    peak = 0

    async def slow_reader() -> str:
        now = asyncio.get_running_loop().time()
        pieces = plane.generate_stream(GenerateRequest("prompt"), None, now, 2**20)
        try:
            text = (await anext(pieces)).text
            await read_on.wait()
            async for piece in pieces:
                text += piece.text
            return text
        finally:
            await pieces.aclose()

    async with frame_server(Path(frames.socket_for(http_socket)), stream_at_once):
        try:
            readers = [asyncio.create_task(slow_reader()) for _ in range(6)]
            for _ in range(100):  # until every frame has come
                await asyncio.sleep(0.01)
                peak = max(peak, budget.unsent)
            read_on.set()
            outcomes = await asyncio.gather(*readers, return_exceptions=True)
        finally:
            await client.close()
    assert 0 < peak <= 60_000
    cut = [each for each in outcomes if isinstance(each, Unavailable)]
    assert cut and all("60000" in each.message for each in cut), outcomes
    assert sorted(set(outcomes) - set(cut)) == [PIECE * PIECES]
    assert budget.unsent == 0
