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
from dataclasses import dataclass, field

from carpool.contract import frames, wire
from carpool.engine.errors import BadModelResponse, ModelUnreachable, SidecarError, Unavailable

Answer = tuple[int, bytes]


@dataclass(slots=True)
class _Waiter:
    """The frames of one batch or stream as they come; its PART frames' bytes, bounded."""

    part_limit: int
    # Told each frame's size as it comes; a SidecarError from it cuts the stream.
    arrived: Callable[[int], None] | None = None
    frames: asyncio.Queue[Answer | SidecarError] = field(default_factory=asyncio.Queue)
    part_bytes: int = 0


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
        frames_in = self.exchange(body, frames.BATCH, 0)
        try:
            return await anext(frames_in)
        finally:
            await frames_in.aclose()

    async def exchange(
        self,
        body: bytes,
        code: int,
        part_limit: int,
        arrived: Callable[[int], None] | None = None,
    ) -> AsyncGenerator[Answer, None]:
        """Send one frame; its answer's frames, PART ones first (at most `part_limit` bytes
        of them), the final one last, each told to `arrived` as it comes."""
        if self.broken:  # its reader would never answer
            raise ModelUnreachable("model server connection closed")
        request_id = next(self._ids) % frames.ID_MODULUS
        waiter = self._waiting[request_id] = _Waiter(part_limit, arrived)
        try:
            self._writer.writelines([frames.header(len(body), request_id, code), body])
            await self._writer.drain()
            while True:
                answer = await waiter.frames.get()
                if isinstance(answer, SidecarError):
                    raise answer
                yield answer
                if answer[0] != frames.PART:
                    return
        except ConnectionError as error:
            raise ModelUnreachable(f"model server connection broke: {error!r}") from error
        finally:
            if self._waiting.pop(request_id, None) is not None and not self._writer.is_closing():
                # Given up on (timeout, cancelled caller): the model server may skip it.
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
                waiter.frames.put_nowait(type(failure)(str(failure)))
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
            waiter.frames.put_nowait(error)
            return
        if code != frames.PART:
            del self._waiting[request_id]
        waiter.frames.put_nowait((code, payload))


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
