"""The model server's framed listener (`carpool.contract.frames`): the sidecar's batch path.

Each connection carries many batches and streams at once; every one runs in its own task,
so a connection keeps reading (and cancelling) while batches wait for the worker thread and
streams for their tokens. HTTP stays beside it for probes, metadata, metrics and
`POST /batch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from carpool.contract import frames, wire
from carpool.contract.wire import Item
from carpool_model_server.errors import ServerError
from carpool_model_server.service import ModelService

log = logging.getLogger(__name__)
# An oversize payload is read past in pieces of this size, never held whole.
SKIP_CHUNK_BYTES = 1024 * 1024
PAYLOAD_TOO_LARGE = 413


class _Connection:
    """One sidecar connection: its batches in flight, by request id."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.batches: dict[int, asyncio.Task[None]] = {}

    def send(self, request_id: int, code: int, payload: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.writelines([frames.header(len(payload), request_id, code), payload])

    def cancel(self, request_id: int) -> None:
        if (task := self.batches.pop(request_id, None)) is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel what still runs, wait for it, and hang up."""
        for task in self.batches.values():
            task.cancel()
        await asyncio.gather(*self.batches.values(), return_exceptions=True)
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class FrameServer:
    def __init__(self, service: ModelService) -> None:
        self._service = service
        self._server: asyncio.Server | None = None
        # The task that serves each connection; asyncio starts them, close() awaits them.
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        # Batch tasks not done yet, of every connection: while any is, a lone batch waits
        # its turn rather than run on this thread ahead of one not at the worker yet.
        self._batch_tasks = 0

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        log.info("listening for frames on %s", path)

    async def close(self, timeout_s: float) -> None:
        """Stop accepting, let batches in flight finish (up to `timeout_s`), then hang up."""
        if self._server is not None:
            self._server.close()
        running = [task for c in self._connections.values() for task in c.batches.values()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        connections = dict(self._connections)
        for connection in connections.values():
            await connection.close()
        await asyncio.gather(*connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = self._connections[task] = _Connection(writer)
        try:
            while True:
                try:
                    head = await reader.readexactly(frames.HEADER.size)
                except asyncio.IncompleteReadError:
                    return  # the sidecar hung up between frames
                length, request_id, code = frames.HEADER.unpack(head)
                if length > wire.MAX_BODY_BYTES:
                    await _skip(reader, length)
                    message = f"batch of {length} bytes is over {wire.MAX_BODY_BYTES}"
                    connection.send(request_id, PAYLOAD_TOO_LARGE, message.encode())
                    continue
                payload = await reader.readexactly(length)
                if code == frames.CANCEL:
                    connection.cancel(request_id)
                elif code == frames.BATCH:
                    self._batch(connection, request_id, payload)
                elif code == frames.STREAM:
                    answers = self._service.stream_body(payload)
                    self._answer_later(connection, request_id, answers)
                else:
                    connection.send(request_id, 400, f"unknown frame code {code}".encode())
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            log.info("sidecar connection broke mid-frame: %r", error)
        finally:
            await connection.close()
            self._connections.pop(task, None)

    def _batch(self, connection: _Connection, request_id: int, payload: bytes) -> None:
        """Answer a batch here and now where the model runs it on this thread (no task, no
        turn of the loop: at one caller, every batch) and no batch read before it is still
        on its way to the worker, else from a task of its own."""
        try:
            items = self._service.decode(payload)
            answer = None if self._batch_tasks else self._service.answer_now(items)
        except Exception as error:
            _send_error(connection, request_id, error)
            return
        if answer is None:
            task = asyncio.create_task(self._answer_batch(connection, request_id, items))
            connection.batches[request_id] = task
            self._batch_tasks += 1
            task.add_done_callback(self._batch_done)
        else:
            connection.send(request_id, frames.OK, answer)

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
                    await connection.writer.drain()
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


async def _skip(reader: asyncio.StreamReader, length: int) -> None:
    while length:
        length -= len(await reader.readexactly(min(length, SKIP_CHUNK_BYTES)))
