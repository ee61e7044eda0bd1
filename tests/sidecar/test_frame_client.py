"""The framed batch path from the sidecar's side, against a scripted frame server in process:
answers find their callers by id in any order, a broken connection fails its batches at
once and the next batch reconnects, a caller who gives up cancels its batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import pytest

from carpool import event_loop
from carpool.contract import frames, wire
from carpool.engine.errors import BadModelResponse, ModelUnreachable, PayloadTooLarge, Unavailable
from carpool_sidecar.client import ModelClient
from carpool_sidecar.frame_client import FramedBatches

Frame = tuple[int, int, bytes]  # request id, code, payload
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    length, request_id, code = frames.HEADER.unpack(await reader.readexactly(frames.HEADER.size))
    return request_id, code, await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, request_id: int, code: int, payload: bytes) -> None:
    writer.write(frames.header(len(payload), request_id, code) + payload)


@asynccontextmanager
async def frame_server(path: Path, script: Script) -> AsyncIterator[list[int]]:
    """Serve `script` on every connection; yields the count of connections so far."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield connections
    finally:
        server.close()
        await server.wait_closed()


async def echo_reversed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every three batches in reverse order, each with its own payload."""
    while True:
        batch = [await read_frame(reader) for _ in range(3)]
        for request_id, _, payload in reversed(batch):
            write_frame(writer, request_id, frames.OK, b"answer to " + payload)


async def test_answers_find_their_callers_in_any_order(tmp_path: Path) -> None:
    path = tmp_path / "f.sock"
    async with frame_server(path, echo_reversed) as connections:
        batches = FramedBatches(str(path))
        try:
            answers = await asyncio.gather(*(batches.send(b"%d" % i, 5.0) for i in range(6)))
        finally:
            await batches.close()
    assert answers == [b"answer to %d" % i for i in range(6)]
    assert len(connections) == 1  # one connection carries them all


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_answers_cut_across_reads_or_joined_in_one_find_their_callers(
    tmp_path: Path, loop: str
) -> None:
    """On either loop the sidecar may run: two answers in one write, then one in pieces."""

    async def joined_then_cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        batch = [await read_frame(reader) for _ in range(3)]
        answers = [frames.header(len(p) + 3, i, frames.OK) + b"to " + p for i, _, p in batch]
        writer.write(answers[2] + answers[0])
        for at in range(0, len(answers[1]), 3):
            await writer.drain()
            await asyncio.sleep(0.01)  # each piece a read of its own
            writer.write(answers[1][at : at + 3])
        await reader.read()

    async def main() -> list[bytes]:
        async with frame_server(tmp_path / "f.sock", joined_then_cut):
            batches = FramedBatches(str(tmp_path / "f.sock"))
            try:
                return await asyncio.gather(*(batches.send(b"%d" % i, 5.0) for i in range(3)))
            finally:
                await batches.close()

    with asyncio.Runner(loop_factory=event_loop.loop_factory(loop)) as runner:
        assert runner.run(main()) == [b"to 0", b"to 1", b"to 2"]


async def test_a_connection_that_breaks_fails_its_batches_at_once_and_the_next_reconnects(
    tmp_path: Path,
) -> None:
    async def hang_up_on_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_id, _, _ = await read_frame(reader)
        if len(connections) == 1:
            await read_frame(reader)  # both batches are in flight, then the server dies
            return
        write_frame(writer, request_id, frames.OK, b"fine")
        await reader.read()

    path = tmp_path / "f.sock"
    async with frame_server(path, hang_up_on_first) as connections:
        batches = FramedBatches(str(path))
        try:
            started = time.monotonic()
            failures = await asyncio.gather(
                batches.send(b"a", 30.0), batches.send(b"b", 30.0), return_exceptions=True
            )
            assert time.monotonic() - started < 2.0
            assert all(isinstance(f, ModelUnreachable) for f in failures), failures
            assert await batches.send(b"c", 5.0) == b"fine"
        finally:
            await batches.close()
    assert len(connections) == 2


async def test_no_model_server_is_unreachable(tmp_path: Path) -> None:
    batches = FramedBatches(str(tmp_path / "none.sock"))
    with pytest.raises(ModelUnreachable, match="unreachable"):
        await batches.send(b"x", 1.0)


async def test_a_batch_past_its_timeout_is_cancelled_on_the_server(tmp_path: Path) -> None:
    seen: list[Frame] = []

    async def answer_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            frame = await read_frame(reader)
            seen.append(frame)
            if frame[2] == b"quick":
                write_frame(writer, frame[0], frames.OK, b"quick answer")

    path = tmp_path / "f.sock"
    async with frame_server(path, answer_late):
        batches = FramedBatches(str(path))
        try:
            with pytest.raises(Unavailable, match=r"within 0\.100 s"):
                await batches.send(b"slow", 0.1)
            # The connection stays: the next batch is answered on it.
            assert await batches.send(b"quick", 5.0) == b"quick answer"
        finally:
            await batches.close()
    (slow_id, _, _), cancel, _ = seen
    assert cancel == (slow_id, frames.CANCEL, b"")


async def test_an_error_code_fails_the_batch_with_its_message(tmp_path: Path) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_id, _, _ = await read_frame(reader)
        write_frame(writer, request_id, 503, b"model is not ready")
        await reader.read()

    path = tmp_path / "f.sock"
    async with frame_server(path, refuse):
        batches = FramedBatches(str(path))
        try:
            with pytest.raises(Unavailable, match="answered 503: model is not ready") as caught:
                await batches.send(b"x", 5.0)
            assert not isinstance(caught.value, ModelUnreachable)
        finally:
            await batches.close()


async def test_an_oversize_answer_is_a_bad_response(tmp_path: Path) -> None:
    async def oversize(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_id, _, _ = await read_frame(reader)
        writer.write(frames.header(wire.MAX_BODY_BYTES + 1, request_id, frames.OK))
        await reader.read()

    path = tmp_path / "f.sock"
    async with frame_server(path, oversize):
        batches = FramedBatches(str(path))
        try:
            with pytest.raises(BadModelResponse, match="frame of"):
                await batches.send(b"x", 5.0)
        finally:
            await batches.close()


async def test_a_result_whose_status_is_no_integer_is_a_bad_response(tmp_path: Path) -> None:
    """The model server's answer is input: a malformed result is its fault (502), not a
    sidecar bug (500 with a traceback per batch)."""
    answer = msgpack.packb({"results": [{"error": "broken", "status": "teapot"}]})

    async def malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request_id, _, _ = await read_frame(reader)
            write_frame(writer, request_id, frames.OK, answer)

    http_socket = tmp_path / "m.sock"
    async with frame_server(Path(frames.socket_for(http_socket)), malformed):
        client = ModelClient(f"unix://{http_socket}")
        try:
            with pytest.raises(BadModelResponse, match="status must be an integer"):
                await client.infer([{"x": wire.Tensor("FP32", (1,), b"\0" * 4)}], 5.0)
        finally:
            await client.close()


async def test_a_stream_over_its_part_limit_is_cancelled_and_fails(tmp_path: Path) -> None:
    """A model server that streams without end is cut off at the caller's limit: the caller
    gets 413 (an answer over the limit) and the model server a cancel, while the link keeps
    serving."""
    cancelled = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_id, code, _ = await read_frame(reader)
        assert code == frames.STREAM
        for _ in range(100):
            write_frame(writer, request_id, frames.PART, b"x" * 100)
        while True:
            frame_id, code, _ = await read_frame(reader)
            if code == frames.CANCEL and frame_id == request_id:
                cancelled.set()
            elif code == frames.BATCH:
                write_frame(writer, frame_id, frames.OK, b"still here")

    path = tmp_path / "f.sock"
    async with frame_server(path, endless):
        batches = FramedBatches(str(path))
        try:
            parts = []
            with pytest.raises(PayloadTooLarge, match="limit of 1000 bytes"):
                async for code, payload in batches.stream(b"one item", 1000):
                    assert code == frames.PART
                    parts.append(payload)
            await asyncio.wait_for(cancelled.wait(), 5)
            assert await batches.send(b"next", 5.0) == b"still here"
        finally:
            await batches.close()
    assert len(parts) == 10  # 1,000 bytes of parts, then the eleventh is one too many
