"""The framed stream between the sidecar and the model server, beside its HTTP socket.

One long-lived Unix-socket connection carries many batches at once. Each frame is a fixed
header and a payload; a request id pairs every answer with its batch, so answers may come
in any order and a caller who gave up is simply not waited for.

Header (10 bytes, big-endian): payload length u32, request id u32, code u16.

Sidecar -> server: code BATCH, payload a wire request (`wire.encode_request`); code STREAM,
a wire request of one item whose answer may come in pieces; or code CANCEL, empty payload:
the batch or stream with that id is no longer wanted.
Server -> sidecar: code 200, payload a wire response (`wire.encode_response`); or any
other code but PART, an HTTP status for the whole batch, payload a UTF-8 message. Every
BATCH and STREAM gets exactly one such final answer unless it is cancelled first; a STREAM
may get PART frames before it, each a wire response of one result holding the answer's next
piece (text generation: the new text as `text_output`). A model server that predates STREAM
answers it 400 (an unknown code); one that streams says so in its metadata
(`streams_tokens`), and the sidecar sends STREAM to no other.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Final

from carpool.contract import wire

HEADER: Final = struct.Struct(">IIH")
BATCH: Final = 0
CANCEL: Final = 1
STREAM: Final = 2
OK: Final = 200
PART: Final = 206  # HTTP's Partial Content: more frames follow for this id
# Request ids wrap around within u32; far more batches than can ever be in flight at once.
ID_MODULUS: Final = 2**32
# The framed socket lies next to the model server's HTTP socket, named after it.
SOCKET_SUFFIX: Final = ".frames"


def socket_for(http_socket: str | Path) -> str:
    """The framed socket that a model server listening on `http_socket` serves."""
    return f"{http_socket}{SOCKET_SUFFIX}"


def header(length: int, request_id: int, code: int) -> bytes:
    return HEADER.pack(length, request_id, code)


class WriteFlow:
    """asyncio's write flow control, for a protocol at either end: `drained` waits while
    the transport's buffer is over its high-water mark (and not past a hang-up, whose
    `connection_lost` calls `resume_writing`)."""

    # Set while the transport's buffer is over its high-water mark.
    _writable: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def drained(self) -> None:
        """Once the transport's buffer is back under its high-water mark."""
        while self._writable is not None:
            await asyncio.shield(self._writable)


class FrameParser:
    """Frames parsed from a connection's bytes as they come, at either end (`parse` from
    `data_received`): no reader task to wake per frame. A whole frame goes to
    `frame_received`; the header of one whose payload is over `wire.MAX_BODY_BYTES` to
    `oversize_received`, which says whether to read past its payload (in pieces, never held
    whole) or stop reading the connection."""

    # Bytes of a frame not whole yet.
    _buffer: bytearray
    # Bytes of an oversize payload still to be read past.
    _skipping = 0

    def frame_received(self, request_id: int, code: int, payload: bytes) -> None:
        raise NotImplementedError

    def oversize_received(self, length: int, request_id: int) -> bool:
        raise NotImplementedError

    def parse(self, data: bytes) -> None:
        view: bytes | bytearray = data
        if self._skipping:
            skipped = min(self._skipping, len(data))
            self._skipping -= skipped
            view = data = data[skipped:]
        # The common case, whole frames in one read, is parsed from `data` without a copy
        # into the buffer.
        if self._buffer:
            self._buffer += data
            view = self._buffer
        start, end = 0, len(view)
        while end - start >= HEADER.size:
            length, request_id, code = HEADER.unpack_from(view, start)
            start += HEADER.size
            if length > wire.MAX_BODY_BYTES:
                if not self.oversize_received(length, request_id):
                    self._buffer.clear()
                    return
                skipped = min(length, end - start)
                start += skipped
                self._skipping = length - skipped
                continue
            if end - start < length:
                start -= HEADER.size
                break
            payload = bytes(view[start : start + length])
            start += length
            self.frame_received(request_id, code, payload)
        if view is self._buffer:
            del self._buffer[:start]
        elif start < end:
            self._buffer += view[start:]
