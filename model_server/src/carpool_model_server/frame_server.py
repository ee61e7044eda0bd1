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
from pathlib import Path

from carpool.contract import frames, wire
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
                elif code in (frames.BATCH, frames.STREAM):
                    batch = asyncio.create_task(self._answer(connection, request_id, code, payload))
                    connection.batches[request_id] = batch
                else:
                    connection.send(request_id, 400, f"unknown frame code {code}".encode())
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            log.info("sidecar connection broke mid-frame: %r", error)
        finally:
            await connection.close()
            self._connections.pop(task, None)

    async def _answer(
        self, connection: _Connection, request_id: int, code: int, payload: bytes
    ) -> None:
        # The one place that turns domain errors into frame codes, as app.py does for HTTP.
        try:
            if code == frames.BATCH:
                connection.send(request_id, frames.OK, await self._service.infer_body(payload))
                return
            async for answer_code, answer in self._service.stream_body(payload):
                connection.send(request_id, answer_code, answer)
                if answer_code == frames.PART:
                    # A slow sidecar slows its stream, not the memory of this process.
                    await connection.writer.drain()
        except ServerError as error:
            connection.send(request_id, error.status, str(error).encode())
        except Exception as error:
            log.exception("unexpected error in a framed batch")
            connection.send(request_id, 500, f"internal error: {error!r}".encode())
        finally:
            connection.batches.pop(request_id, None)


async def _skip(reader: asyncio.StreamReader, length: int) -> None:
    while length:
        length -= len(await reader.readexactly(min(length, SKIP_CHUNK_BYTES)))
