"""Batches to the model server over one long-lived framed connection (`carpool.contract.frames`).

The connection opens with the first batch and again with the first batch after it broke;
every batch in flight when it breaks fails with ModelUnreachable at once. A batch whose
caller gives up is cancelled on the model server, as an HTTP disconnect would cancel it.
A stream (one generate request whose answer comes in PART frames) is a batch whose answer
is read piece by piece; its pieces count against the limit its caller gives, and each of
its frames is offered to the caller's `arrived` as it comes (the caller may refuse it, which
cuts the stream), since it waits here until the caller takes it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import cast

from carpool.contract import frames
from carpool.engine.errors import (
    BadModelResponse,
    ModelUnreachable,
    PayloadTooLarge,
    SidecarError,
    Unavailable,
)

Answer = tuple[int, bytes]


@dataclass(slots=True)
class _Waiter:
    """The frames of one batch or stream as they come; its PART frames' bytes, bounded."""

    part_limit: int
    # Told each frame's size as it comes; a SidecarError from it cuts the stream.
    arrived: Callable[[int], None] | None = None
    # A batch's answer is its first frame, a stream's come one by one: a queue for a
    # stream only (a queue and its event per batch cost more than the batch's own frame).
    reply: asyncio.Future[Answer | SidecarError] | None = None
    frames: asyncio.Queue[Answer | SidecarError] | None = None
    part_bytes: int = 0

    def put(self, frame: Answer | SidecarError) -> None:
        if self.frames is not None:
            self.frames.put_nowait(frame)
        elif self.reply is not None and not self.reply.done():
            self.reply.set_result(frame)


class _Link(frames.FrameParser, frames.WriteFlow, asyncio.Protocol):
    """One open connection and the batches waiting on it. Its frames are parsed as the bytes
    come and handed to their waiters from there: no reader task, whose wake-up per frame
    would stand between every answer and its batch."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, _Waiter] = {}
        self._ids = itertools.count()
        self._buffer = bytearray()
        self._closed = False

    @property
    def broken(self) -> bool:
        return self._closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclasses of asyncio's, but have their methods.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._fail(ModelUnreachable("model server connection closed"))
        else:
            self._fail(ModelUnreachable(f"model server connection broke: {exc!r}"))

    def eof_received(self) -> None:
        self._fail(ModelUnreachable("model server connection closed"))

    def data_received(self, data: bytes) -> None:
        self.parse(data)

    def oversize_received(self, length: int, request_id: int) -> bool:
        self._fail(BadModelResponse(f"model server sent a frame of {length} bytes"))
        return False

    async def call(self, body: bytes, deadline: float, timeout_s: float) -> Answer:
        """One batch frame's answer; Unavailable if none came by `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Answer | SidecarError] = loop.create_future()
        waiter = _Waiter(0, reply=reply)
        request_id = self._expect(waiter)
        # A timer that answers the future, not asyncio.timeout (a timeout object and the
        # task's cancellation): this runs for every batch.
        expiry = loop.call_at(deadline, _expire, reply, timeout_s)
        try:
            self._write(body, request_id, frames.BATCH)
            if self._writable is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        await self.drained()
                except TimeoutError:
                    raise _late(timeout_s) from None
            answer = await reply
        finally:
            expiry.cancel()
            self._given_up(request_id)
        if isinstance(answer, SidecarError):
            raise answer
        return answer

    async def exchange(
        self,
        body: bytes,
        code: int,
        part_limit: int,
        arrived: Callable[[int], None] | None = None,
    ) -> AsyncGenerator[Answer, None]:
        """Send one frame; its answer's frames, PART ones first (at most `part_limit` bytes
        of them), the final one last, each told to `arrived` as it comes."""
        queue: asyncio.Queue[Answer | SidecarError] = asyncio.Queue()
        request_id = self._expect(_Waiter(part_limit, arrived, frames=queue))
        try:
            self._write(body, request_id, code)
            await self.drained()
            while True:
                answer = await queue.get()
                if isinstance(answer, SidecarError):
                    raise answer
                yield answer
                if answer[0] != frames.PART:
                    return
        finally:
            self._given_up(request_id)

    def _expect(self, waiter: _Waiter) -> int:
        """A request id whose answer's frames are to come to `waiter`."""
        if self._closed:  # nothing would answer
            raise ModelUnreachable("model server connection closed")
        request_id = next(self._ids) % frames.ID_MODULUS
        self._waiting[request_id] = waiter
        return request_id

    def _write(self, body: bytes, request_id: int, code: int) -> None:
        assert self._transport is not None
        self._transport.writelines([frames.header(len(body), request_id, code), body])

    def _given_up(self, request_id: int) -> None:
        """A frame whose answer is no longer awaited (a timeout, a cancelled caller) is
        cancelled: the model server may skip it."""
        if self._waiting.pop(request_id, None) is not None and not self._closed:
            self._write(b"", request_id, frames.CANCEL)

    async def close(self) -> None:
        self._fail(ModelUnreachable("model server connection closed"))

    def _fail(self, failure: SidecarError) -> None:
        """Close the connection; every batch waiting on it hears `failure` at once."""
        self._closed = True
        self._buffer.clear()
        if self._transport is not None:
            self._transport.close()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            # One instance each: tracebacks are per raise.
            waiter.put(type(failure)(str(failure)))
        self.resume_writing()

    def frame_received(self, request_id: int, code: int, payload: bytes) -> None:
        waiter = self._waiting.get(request_id)
        if waiter is None:
            return  # given up on
        if code == frames.PART:
            waiter.part_bytes += len(payload)
        try:
            if code == frames.PART and waiter.part_bytes > waiter.part_limit:
                # The caller asked for more than an answer may hold, as a whole answer
                # over the limit is refused: not the model server's fault.
                raise PayloadTooLarge(
                    f"the answer streamed passed the limit of {waiter.part_limit} bytes for "
                    "one answer; ask for fewer tokens"
                )
            if waiter.arrived is not None:
                waiter.arrived(len(payload))
        except SidecarError as error:
            del self._waiting[request_id]
            if code == frames.PART:
                self._write(b"", request_id, frames.CANCEL)
            waiter.put(error)
            return
        if code != frames.PART:
            del self._waiting[request_id]
        waiter.put((code, payload))


def _expire(reply: asyncio.Future[Answer | SidecarError], timeout_s: float) -> None:
    if not reply.done():
        reply.set_result(_late(timeout_s))


def _late(timeout_s: float) -> Unavailable:
    return Unavailable(f"model server did not answer within {timeout_s:.3f} s")


class FramedBatches:
    """The batch path to a model server's framed socket."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._link: _Link | None = None
        self._opening = asyncio.Lock()

    async def send(self, body: bytes, timeout_s: float) -> bytes:
        """One batch round trip: the wire response body; SidecarError on any failure."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        link = self._link
        if link is None or link.broken:
            try:
                async with asyncio.timeout_at(deadline):
                    link = await self._connected()
            except TimeoutError:
                raise _late(timeout_s) from None
        code, payload = await link.call(body, deadline, timeout_s)
        if code != frames.OK:
            detail = payload[:300].decode(errors="replace")
            raise Unavailable(f"model server answered {code}: {detail}")
        return payload

    async def stream(
        self, body: bytes, part_limit: int, arrived: Callable[[int], None] | None = None
    ) -> AsyncGenerator[Answer, None]:
        """One stream frame's answer: its PART frames (code, payload), then the final
        frame's payload with code 200; SidecarError on any failure, `arrived`'s too. The
        caller bounds the time it waits."""
        link = await self._connected()
        answers = link.exchange(body, frames.STREAM, part_limit, arrived)
        try:
            async for code, payload in answers:
                if code not in (frames.OK, frames.PART):
                    detail = payload[:300].decode(errors="replace")
                    raise Unavailable(f"model server answered {code}: {detail}")
                yield code, payload
        finally:
            await answers.aclose()

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
            self._link = None

    async def _connected(self) -> _Link:
        if self._link is not None and not self._link.broken:
            return self._link  # no lock to take: every batch but the first
        async with self._opening:
            if self._link is not None and self._link.broken:
                await self.close()
            if self._link is None:
                loop = asyncio.get_running_loop()
                try:
                    _, self._link = await loop.create_unix_connection(_Link, self._path)
                except OSError as error:
                    raise ModelUnreachable(f"model server unreachable: {error!r}") from error
            return self._link
