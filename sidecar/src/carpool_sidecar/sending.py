"""Sending REST answers to callers who may not read them.

An answer goes out in chunks (a stream's, in its events), and each chunk must leave for the
socket within `idle_s` (the body timeout, as for bodies coming in): a caller who stops
reading has its connection cut (the unsent rest is dropped, not kept) and its answer counted
as 408. Answers still being written when a drain ends are cut too, so that SIGTERM ends
within the drain it promised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from aiohttp import web

from carpool.engine.errors import BodyTimeout

# What one write hands the socket: small enough that a reader who stops holds little in
# the transport's buffer, large enough to be cheap.
CHUNK_BYTES = 256 * 1024
# Answers up to this size, into a transport holding at most as much unsent, are written
# without a timer per write.
SMALL_BYTES = 16 * 1024


class _Answer(web.StreamResponse):
    # Headers leave with the body's first write, as aiohttp's own Response sends them, not
    # in a send of their own: a small answer is one send, not two.
    _send_headers_immediately = False


class AnswerSending:
    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        # Loop time by which a draining sidecar has sent everything, once SIGTERM came.
        self.drained_by: float | None = None
        self._writing: set[asyncio.Transport] = set()
        self._done = asyncio.Event()
        self._done.set()

    def drain_left_s(self) -> float:
        """Seconds left until `drained_by` (0 once past): every step of a drain takes its
        time from this one deadline, so that the steps together keep to the grace."""
        assert self.drained_by is not None, "no drain yet"
        return max(0.0, self.drained_by - asyncio.get_running_loop().time())

    async def send(
        self,
        request: web.BaseRequest,
        parts: Sequence[bytes | memoryview],
        headers: dict[str, str],
        *,
        close: bool = False,
    ) -> web.StreamResponse:
        """Send a body given in parts (a JSON header, then binary outputs) without joining
        them; returns once its last byte has gone to the socket. `close`: the connection
        closes after it (Connection: close)."""
        transport = request.transport
        response = _Answer(headers=headers)
        if close:
            response.force_close()
        response.content_length = length = sum(len(part) for part in parts)
        if len(parts) > 1 and length <= CHUNK_BYTES:
            parts = [b"".join(parts)]
        if transport is None:  # the caller already left
            return response
        self._writing.add(transport)
        self._done.clear()
        try:
            await response.prepare(request)
            if _unhindered(transport, length):
                # Sent with the headers and the end in one call (joining one part of bytes
                # copies nothing).
                await response.write_eof(b"".join(parts))
                return response
            sent = 0
            for part in parts:
                view = memoryview(part).cast("B")
                for start in range(0, len(view), CHUNK_BYTES):
                    chunk = view[start : start + CHUNK_BYTES]
                    await self._timed(response.write(chunk), transport, sent)
                    sent += len(chunk)
            await self._timed(response.write_eof(), transport, sent)
        finally:
            self._writing.discard(transport)
            if not self._writing:
                self._done.set()
        return response

    async def write(
        self, request: web.BaseRequest, response: web.StreamResponse, data: bytes, sent: int
    ) -> None:
        """One more piece of an answer sent as it comes (a stream's event, `sent` bytes
        after its start), which must leave for the socket within `idle_s` as each chunk of
        `send`'s does: a caller who stops reading a stream does not hold it open."""
        transport = request.transport
        write = response.write(data)
        if transport is None or _unhindered(transport, len(data)):  # None: the write says so
            await write
            return
        await self._timed(write, transport, sent)

    async def finish(self, grace_s: float) -> None:
        """Wait `grace_s` at most for the answers being written, then cut those left."""
        try:
            async with asyncio.timeout(grace_s):
                await self._done.wait()
        except TimeoutError:
            for transport in list(self._writing):
                transport.abort()

    async def _timed(self, write: Awaitable[None], transport: asyncio.Transport, sent: int) -> None:
        try:
            async with asyncio.timeout(self._idle_s):
                await write
        except TimeoutError:
            transport.abort()
            raise BodyTimeout(
                f"the answer was not read for {self._idle_s:g} s after {sent} bytes"
            ) from None


def _unhindered(transport: asyncio.Transport, nbytes: int) -> bool:
    """Whether `nbytes` written now leave the transport under its high-water mark (64 KiB
    in asyncio and uvloop): then no write waits for the reader, so none needs a timer."""
    return nbytes <= SMALL_BYTES and transport.get_write_buffer_size() <= SMALL_BYTES
