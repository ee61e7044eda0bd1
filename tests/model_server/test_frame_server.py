"""The model server's framed listener in process, with the toy model and the sidecar's own
client: many batches on one connection, refusals that leave the connection serving,
cancellation, and a shutdown that lets the batch in flight finish."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from carpool import event_loop
from carpool.contract import frames, wire
from carpool.contract.wire import Tensor
from carpool.engine.errors import Unavailable
from carpool_model_server.frame_server import FrameServer
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_toy import ToyHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_model_server.service import ModelService
from carpool_sidecar.client import ModelClient

FORWARD_S = 0.2


class SlowToy(ToyHandler):
    """The toy model; a batch whose first value is negative takes FORWARD_S."""

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.forwarded: list[float] = []

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        self.forwarded.append(float(batch[0, 0]))
        if batch[0, 0] < 0:
            time.sleep(FORWARD_S)
        return super().infer(batch)


def item(value: float) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.full(4, value, dtype=np.float32))}


def values(results: Sequence[wire.ItemResult]) -> list[float]:
    return [float(r.outputs["output"].to_numpy()[0]) for r in results if r.outputs]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[FrameServer, SlowToy, Path]]:
    async with serving(tmp_path) as server:
        yield server


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[FrameServer, SlowToy, Path]]:
    handler = SlowToy(HandlerSettings(None, torch.float32, 16))
    service = ModelService(
        "toy", Runner(handler, torch.device("cpu"), ModelMetrics.create("toy"), 16)
    )
    await service.start(1, [])
    http_socket = tmp_path / "model.sock"
    server = FrameServer(service)
    await server.start(Path(frames.socket_for(http_socket)))
    try:
        yield server, handler, http_socket
    finally:
        await server.close(5.0)
        service.runner.close()


async def raw_call(
    path: Path, frames_out: Sequence[bytes], answers: int
) -> list[tuple[int, int, bytes]]:
    """Write frames on one fresh connection; read `answers` frames back."""
    reader, writer = await asyncio.open_unix_connection(frames.socket_for(path))
    try:
        writer.writelines(frames_out)
        got = []
        for _ in range(answers):
            length, request_id, code = frames.HEADER.unpack(
                await reader.readexactly(frames.HEADER.size)
            )
            got.append((request_id, code, await reader.readexactly(length)))
        return got
    finally:
        writer.close()


def frame(request_id: int, code: int, payload: bytes) -> bytes:
    return frames.header(len(payload), request_id, code) + payload


async def test_concurrent_batches_share_one_connection_and_keep_their_order(
    served: tuple[FrameServer, SlowToy, Path],
) -> None:
    _, _, socket = served
    client = ModelClient(f"unix://{socket}")
    try:
        batches = [[item(10 * b + i) for i in range(4)] for b in range(8)]
        answers = await asyncio.gather(*(client.infer(batch, 10.0) for batch in batches))
    finally:
        await client.close()
    assert [values(results) for results, _ in answers] == [
        [2 * (10 * b + i) + 1 for i in range(4)] for b in range(8)
    ]


async def test_refusals_leave_the_connection_serving(
    served: tuple[FrameServer, SlowToy, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, socket = served
    monkeypatch.setattr(wire, "MAX_BODY_BYTES", 1024)
    good = wire.encode_request([item(1)])
    answers = await raw_call(
        socket,
        [
            frame(1, frames.BATCH, b"not msgpack"),
            frame(2, frames.BATCH, b"x" * 2048),
            frame(3, 7, b""),
            frame(4, frames.BATCH, good),
        ],
        4,
    )
    by_id = {request_id: (code, payload) for request_id, code, payload in answers}
    assert by_id[1][0] == 400 and b"invalid batch body" in by_id[1][1]
    assert by_id[2] == (413, b"batch of 2048 bytes is over 1024")
    assert by_id[3] == (400, b"unknown frame code 7")
    assert by_id[4][0] == frames.OK and values(wire.decode_response(by_id[4][1])) == [3]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_frames_cut_across_reads_or_joined_in_one_are_each_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    """On either loop the model server may run: two frames in one write, an oversize one
    read past in pieces, then a frame cut into pieces, each piece a read of its own."""
    monkeypatch.setattr(wire, "MAX_BODY_BYTES", 1024)
    joined = frame(1, frames.BATCH, wire.encode_request([item(1)])) + frame(
        2, frames.BATCH, wire.encode_request([item(2), item(3)])
    )
    oversize = frame(3, frames.BATCH, b"x" * 2048)
    cut = frame(4, frames.BATCH, wire.encode_request([item(4)]))

    async def main() -> dict[int, tuple[int, bytes]]:
        async with serving(tmp_path) as (_, _, socket):
            reader, writer = await asyncio.open_unix_connection(frames.socket_for(socket))
            try:
                writer.write(joined)
                pieces = [oversize[:5], oversize[5:700], oversize[700:] + cut[:3]]
                pieces += [cut[at : at + 7] for at in range(3, len(cut), 7)]
                for piece in pieces:
                    await writer.drain()
                    await asyncio.sleep(0.01)  # each piece a read of its own
                    writer.write(piece)
                answers = {}
                async with asyncio.timeout(10):
                    for _ in range(4):
                        head = await reader.readexactly(frames.HEADER.size)
                        length, request_id, code = frames.HEADER.unpack(head)
                        answers[request_id] = (code, await reader.readexactly(length))
                return answers
            finally:
                writer.close()

    with asyncio.Runner(loop_factory=event_loop.loop_factory(loop)) as runner:
        answers = runner.run(main())
    assert answers[3] == (413, b"batch of 2048 bytes is over 1024")
    for request_id, expected in [(1, [3]), (2, [5, 7]), (4, [9])]:
        code, payload = answers[request_id]
        assert code == frames.OK and values(wire.decode_response(payload)) == expected


async def test_a_lone_batch_that_fails_unexpectedly_is_a_500_and_the_connection_serves(
    served: tuple[FrameServer, SlowToy, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone brief batch is answered in its frame's own turn, not in a task of its own:
    an error there is still that batch's answer alone."""
    _, _, socket = served
    good = wire.encode_request([item(1)])
    await raw_call(socket, [frame(1, frames.BATCH, good)], 1)  # its kind is now brief
    encode = wire.encode_response
    failures = iter([RuntimeError("boom")])

    def failing_once(*args: object) -> bytes:
        if (error := next(failures, None)) is not None:
            raise error
        return encode(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(wire, "encode_response", failing_once)
    answers = await raw_call(
        socket, [frame(2, frames.BATCH, good), frame(3, frames.BATCH, good)], 2
    )
    by_id = {request_id: (code, payload) for request_id, code, payload in answers}
    assert by_id[2] == (500, b"internal error: RuntimeError('boom')")
    assert by_id[3][0] == frames.OK and values(wire.decode_response(by_id[3][1])) == [3]


async def test_a_lone_batch_read_with_a_larger_one_runs_after_it(
    served: tuple[FrameServer, SlowToy, Path],
) -> None:
    """Frames read together keep their order at the model: a brief lone batch that the loop
    could run at once does not jump ahead of the batch before it, still on its way to the
    worker."""
    _, handler, socket = served
    lone = wire.encode_request([item(1)])
    for request_id in range(3):  # the lone kind learned brief, on the worker and the loop
        await raw_call(socket, [frame(request_id, frames.BATCH, lone)], 1)
    handler.forwarded.clear()
    larger = wire.encode_request([item(10 + i) for i in range(4)])
    await raw_call(socket, [frame(1, frames.BATCH, larger), frame(2, frames.BATCH, lone)], 2)
    assert handler.forwarded == [10, 1]


async def test_a_cancelled_batch_does_not_reach_the_model(
    served: tuple[FrameServer, SlowToy, Path],
) -> None:
    _, handler, socket = served
    slow, waiting = wire.encode_request([item(-1)]), wire.encode_request([item(5)])
    answers = await raw_call(
        socket,
        [
            frame(1, frames.BATCH, slow),
            frame(2, frames.BATCH, waiting),
            frame(2, frames.CANCEL, b""),
            frame(3, frames.BATCH, wire.encode_request([item(6)])),
        ],
        2,
    )
    assert sorted(request_id for request_id, _, _ in answers) == [1, 3]
    assert 5.0 not in handler.forwarded and handler.forwarded[-1] == 6.0


async def test_shutdown_finishes_the_batch_in_flight_then_hangs_up(
    served: tuple[FrameServer, SlowToy, Path],
) -> None:
    server, _, socket = served
    client = ModelClient(f"unix://{socket}")
    try:
        pending = asyncio.create_task(client.infer([item(-2)], 10.0))
        await asyncio.sleep(FORWARD_S / 4)
        await server.close(5.0)
        assert values((await pending)[0]) == [-3]
        with pytest.raises(Unavailable):
            await client.infer([item(1)], 2.0)
    finally:
        await client.close()


async def test_shutdown_hangs_up_on_a_sidecar_that_reads_no_answers(
    served: tuple[FrameServer, SlowToy, Path],
) -> None:
    """Answers the sidecar leaves unread fill the socket: shutdown still ends within its
    timeout, cutting them. (Before, it waited for them to be read, forever.)"""
    server, _, socket = served
    _, writer = await asyncio.open_unix_connection(frames.socket_for(socket))
    try:
        batch = wire.encode_request([item(1)] * 16)
        writer.writelines(frame(request_id, frames.BATCH, batch) for request_id in range(3000))
        await writer.drain()
        for _ in range(500):  # until the model server's answers wait for the socket
            if any(c.transport and c.transport.get_write_buffer_size() for c in server.connections):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the answers all fit in the socket")
        async with asyncio.timeout(5):
            await server.close(0.5)
        assert not server.connections
    finally:
        writer.close()
