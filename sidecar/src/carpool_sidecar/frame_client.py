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
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from carpool.contract import frames, wire
from carpool.engine.errors import BadModelResponse, ModelUnreachable, SidecarError, Unavailable

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


class _Link:
    """One open connection and the batches waiting on it; a reader task owns its input."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._waiting: dict[int, _Waiter] = {}
        self._ids = itertools.count()
        self._reading = asyncio.create_task(self._read(reader), name="carpool-model-frames")

    @property
    def broken(self) -> bool:
        return self._reading.done()

    async def call(self, body: bytes) -> Answer:
        """One batch frame's answer."""
        reply: asyncio.Future[Answer | SidecarError] = asyncio.get_running_loop().create_future()
        request_id = self._expect(_Waiter(0, reply=reply))
        try:
            self._write(body, request_id, frames.BATCH)
            await self._writer.drain()
            answer = await reply
        except ConnectionError as error:
            raise ModelUnreachable(f"model server connection broke: {error!r}") from error
        finally:
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
            await self._writer.drain()
            while True:
                answer = await queue.get()
                if isinstance(answer, SidecarError):
                    raise answer
                yield answer
                if answer[0] != frames.PART:
                    return
        except ConnectionError as error:
            raise ModelUnreachable(f"model server connection broke: {error!r}") from error
        finally:
            self._given_up(request_id)

    def _expect(self, waiter: _Waiter) -> int:
        """A request id whose answer's frames are to come to `waiter`."""
        if self.broken:  # its reader would never answer
            raise ModelUnreachable("model server connection closed")
        request_id = next(self._ids) % frames.ID_MODULUS
        self._waiting[request_id] = waiter
        return request_id

    def _write(self, body: bytes, request_id: int, code: int) -> None:
        self._writer.writelines([frames.header(len(body), request_id, code), body])

    def _given_up(self, request_id: int) -> None:
        """A frame whose answer is no longer awaited (a timeout, a cancelled caller) is
        cancelled: the model server may skip it."""
        if self._waiting.pop(request_id, None) is not None and not self._writer.is_closing():
            self._writer.write(frames.header(0, request_id, frames.CANCEL))

    async def close(self) -> None:
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading

    async def _read(self, reader: asyncio.StreamReader) -> None:
        failure: SidecarError = ModelUnreachable("model server connection closed")
        try:
            while True:
                head = await reader.readexactly(frames.HEADER.size)
                length, request_id, code = frames.HEADER.unpack(head)
                if length > wire.MAX_BODY_BYTES:
                    failure = BadModelResponse(f"model server sent a frame of {length} bytes")
                    return
                payload = await reader.readexactly(length)
                self._deliver(request_id, code, payload)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            failure = ModelUnreachable(f"model server connection broke: {error!r}")
        finally:
            self._writer.close()
            for waiter in self._waiting.values():
                # One instance each: tracebacks are per raise.
                waiter.put(type(failure)(str(failure)))
            self._waiting.clear()

    def _deliver(self, request_id: int, code: int, payload: bytes) -> None:
        waiter = self._waiting.get(request_id)
        if waiter is None:
            return  # given up on
        if code == frames.PART:
            waiter.part_bytes += len(payload)
        try:
            if code == frames.PART and waiter.part_bytes > waiter.part_limit:
                message = f"model server streamed over {waiter.part_limit} bytes for one answer"
                raise BadModelResponse(message)
            if waiter.arrived is not None:
                waiter.arrived(len(payload))
        except SidecarError as error:
            del self._waiting[request_id]
            if code == frames.PART:
                self._writer.write(frames.header(0, request_id, frames.CANCEL))
            waiter.put(error)
            return
        if code != frames.PART:
            del self._waiting[request_id]
        waiter.put((code, payload))


class FramedBatches:
    """The batch path to a model server's framed socket."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._link: _Link | None = None
        self._opening = asyncio.Lock()

    async def send(self, body: bytes, timeout_s: float) -> bytes:
        """One batch round trip: the wire response body; SidecarError on any failure."""
        try:
            async with asyncio.timeout(timeout_s):
                link = await self._connected()
                code, payload = await link.call(body)
        except TimeoutError as error:
            raise Unavailable(f"model server did not answer within {timeout_s:.3f} s") from error
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
                try:
                    reader, writer = await asyncio.open_unix_connection(
                        self._path, limit=wire.MAX_BODY_BYTES
                    )
                except OSError as error:
                    raise ModelUnreachable(f"model server unreachable: {error!r}") from error
                self._link = _Link(reader, writer)
            return self._link
