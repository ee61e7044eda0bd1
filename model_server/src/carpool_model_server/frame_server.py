"""The model server's framed listener (`carpool.contract.frames`): the sidecar's batch path.

Each connection carries many batches and streams at once. Its frames are parsed as its bytes
come, and nothing waits in between: a batch on the worker thread is answered when the worker
hears back (or, one that takes steps, and every stream, from a task of its own), so a
connection keeps reading (and cancelling) while they wait. HTTP stays beside it for probes,
metadata, metrics and `POST /batch`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

from carpool.contract import frames, wire
from carpool.contract.wire import Item
from carpool_model_server.errors import ServerError
from carpool_model_server.service import ModelService

log = logging.getLogger(__name__)
PAYLOAD_TOO_LARGE = 413


class _Connection(frames.FrameParser, frames.WriteFlow, asyncio.Protocol):
    """One sidecar connection: its frames parsed as the bytes come (no reader task to wake
    per frame), and its batches and streams in flight, by request id."""

    def __init__(self, server: FrameServer) -> None:
        self._server = server
        self.transport: asyncio.Transport | None = None
        # Batches and streams in flight: tasks, or the worker's futures (`answer_later`).
        self.batches: dict[int, asyncio.Future[Any]] = {}
        self._buffer = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclasses of asyncio's, but have their methods.
        self.transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None or self._buffer or self._skipping:
            log.info("sidecar connection broke mid-frame: %r", exc)
        self._buffer.clear()
        for task in self.batches.values():
            task.cancel()
        self.resume_writing()
        self._server.connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.parse(data)

    def frame_received(self, request_id: int, code: int, payload: bytes) -> None:
        self._server.received(self, request_id, code, payload)

    def oversize_received(self, length: int, request_id: int) -> bool:
        message = f"batch of {length} bytes is over {wire.MAX_BODY_BYTES}"
        self.send(request_id, PAYLOAD_TOO_LARGE, message.encode())
        return True  # read past it: the connection serves on

    def send(self, request_id: int, code: int, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines([frames.header(len(payload), request_id, code), payload])

    def cancel(self, request_id: int) -> None:
        if (task := self.batches.pop(request_id, None)) is not None:
            task.cancel()

    async def close(self, deadline: float) -> None:
        """Cancel what still runs, wait for it, and hang up once the answers written have
        gone to the socket, or at `deadline` (loop time) without them: a sidecar that reads
        nothing does not hold the shutdown."""
        for task in self.batches.values():
            task.cancel()
        await asyncio.gather(*self.batches.values(), return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
            loop = asyncio.get_running_loop()
            await asyncio.wait([self.closed], timeout=max(0.0, deadline - loop.time()))
            if not self.closed.done():
                self.transport.abort()
        await self.closed


class FrameServer:
    def __init__(self, service: ModelService) -> None:
        self._service = service
        self._server: asyncio.Server | None = None
        # The open connections; close() hangs up on each.
        self.connections: set[_Connection] = set()
        # Batch tasks not done yet, of every connection: while any is, a lone batch waits
        # its turn rather than run on this thread ahead of one not at the worker yet.
        self._batch_tasks = 0

    async def start(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), path=str(path))
        log.info("listening for frames on %s", path)

    async def close(self, timeout_s: float) -> None:
        """Stop accepting, let batches in flight finish and their answers go (up to
        `timeout_s`), then hang up."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        if self._server is not None:
            self._server.close()
        running = [task for c in self.connections for task in c.batches.values()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for connection in list(self.connections):
            await connection.close(deadline)

    def received(self, connection: _Connection, request_id: int, code: int, payload: bytes) -> None:
        """One whole frame, read from `connection`."""
        if code == frames.CANCEL:
            connection.cancel(request_id)
        elif code == frames.BATCH:
            self._batch(connection, request_id, payload)
        elif code == frames.STREAM:
            answers = self._service.stream_body(payload)
            self._answer_later(connection, request_id, answers)
        else:
            connection.send(request_id, 400, f"unknown frame code {code}".encode())

    def _batch(self, connection: _Connection, request_id: int, payload: bytes) -> None:
        """Answer a batch here and now where the model runs it on this thread (no task, no
        turn of the loop: at one caller, every batch), else from the worker's answer in the
        turn it comes (`answer_later`: no task either), else from a task of its own. Only a
        task is taken while a batch read before this one is still on its way to the
        worker in a task, so that batches reach the model in the order they came."""
        answer, later = None, None
        try:
            items = self._service.decode(payload)
            if not self._batch_tasks:
                answer = self._service.answer_now(items)
                if answer is None:
                    reply = functools.partial(self._reply, connection, request_id)
                    later = self._service.answer_later(items, reply)
        except Exception as error:
            _send_error(connection, request_id, error)
            return
        if answer is not None:
            connection.send(request_id, frames.OK, answer)
        elif later is not None:
            connection.batches[request_id] = later
        else:
            task = asyncio.create_task(self._answer_batch(connection, request_id, items))
            connection.batches[request_id] = task
            self._batch_tasks += 1
            task.add_done_callback(self._batch_done)

    def _reply(self, connection: _Connection, request_id: int, answer: bytes | Exception) -> None:
        connection.batches.pop(request_id, None)
        if isinstance(answer, bytes):
            connection.send(request_id, frames.OK, answer)
        else:
            _send_error(connection, request_id, answer)

    def _batch_done(self, _: asyncio.Task[None]) -> None:
        self._batch_tasks -= 1

    async def _answer_batch(
        self, connection: _Connection, request_id: int, items: Sequence[Item]
    ) -> None:
        try:
            answer = await self._service.answer(items)
        except Exception as error:
            _send_error(connection, request_id, error)
        else:
            connection.send(request_id, frames.OK, answer)
        finally:
            connection.batches.pop(request_id, None)

    def _answer_later(
        self, connection: _Connection, request_id: int, answers: AsyncIterator[tuple[int, bytes]]
    ) -> None:
        task = asyncio.create_task(self._answer(connection, request_id, answers))
        connection.batches[request_id] = task

    async def _answer(
        self, connection: _Connection, request_id: int, answers: AsyncIterator[tuple[int, bytes]]
    ) -> None:
        try:
            async for code, answer in answers:
                connection.send(request_id, code, answer)
                if code == frames.PART:
                    # A slow sidecar slows its stream, not the memory of this process.
                    await connection.drained()
        except Exception as error:
            _send_error(connection, request_id, error)
        finally:
            connection.batches.pop(request_id, None)


def _send_error(connection: _Connection, request_id: int, error: Exception) -> None:
    """The one place that turns domain errors into frame codes, as app.py does for HTTP."""
    if isinstance(error, ServerError):
        connection.send(request_id, error.status, str(error).encode())
        return
    log.error("unexpected error in a framed batch", exc_info=error)
    connection.send(request_id, 500, f"internal error: {error!r}".encode())
