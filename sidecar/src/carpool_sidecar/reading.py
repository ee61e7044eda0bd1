"""Reading request bodies, bounded in size, in time and in memory across connections.

A client that stops sending mid-body (a Content-Length longer than what comes, a chunked
body that never ends) would otherwise hold its connection and the bytes read so far for as
long as it likes. Here each body must keep arriving (`idle_s` between chunks) and be
complete by the request's deadline (else 408), and all bodies being read at once hold at most
`max_reading_bytes`: past that, new requests are refused before their bodies are read, and
a body still arriving is cut short.
"""

from __future__ import annotations

import asyncio

from aiohttp import StreamReader
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from carpool.engine.errors import BadRequest, BodyTimeout, PayloadTooLarge, Unavailable

# What a refused caller is told to wait: bodies being read finish or time out within seconds.
BUSY_RETRY_AFTER_S = 1


class ReadingBudget:
    """The bytes held by bodies being read, across all connections, and their cap."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def check(self, *, close_connection: bool = False) -> None:
        """Unavailable once the cap is reached; a body cut short closes its connection."""
        if self.held >= self.max_bytes:
            raise Unavailable(
                f"{self.held} bytes of request bodies are being read, the limit is "
                f"{self.max_bytes}; retry shortly",
                retry_after_s=BUSY_RETRY_AFTER_S,
                close_connection=close_connection,
            )


async def read_body(
    content: StreamReader,
    declared: int | None,
    *,
    max_bytes: int,
    budget: ReadingBudget,
    idle_s: float,
    deadline: float,
) -> bytearray:
    """The whole body; `declared` is its Content-Length, `deadline` loop time.

    Raises PayloadTooLarge (before reading, when the declared length says so), BodyTimeout
    when nothing arrives for `idle_s` or the body is incomplete at the deadline, Unavailable
    when the budget is spent, BadRequest when aiohttp cannot decode it; all but an
    Unavailable before the first byte close the connection.
    """
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(
            f"body of {declared} bytes, larger than the limit of {max_bytes}",
            close_connection=True,
        )
    budget.check()
    # Grown in place: a list of chunks joined at the end would hold a large body twice.
    body = bytearray()
    try:
        while True:
            # What has arrived is taken without arming a timer: a small body usually comes
            # whole with its headers.
            chunk = content.read_nowait()
            if not chunk and not content.at_eof():
                chunk = await _next_chunk(content, idle_s, deadline, len(body))
            if not chunk:
                return body
            if len(body) + len(chunk) > max_bytes:
                raise PayloadTooLarge(
                    f"body larger than the limit of {max_bytes} bytes", close_connection=True
                )
            budget.check(close_connection=True)
            body += chunk
            budget.held += len(chunk)
    except RequestPayloadError as error:
        # aiohttp could not decode the body: its Content-Encoding or its chunks are broken.
        cause = error.__cause__
        reason = cause.message if isinstance(cause, HttpProcessingError) else str(error)
        raise BadRequest(f"the body cannot be read: {reason}", close_connection=True) from None
    finally:
        budget.held -= len(body)


async def _next_chunk(content: StreamReader, idle_s: float, deadline: float, held: int) -> bytes:
    """The next bytes of the body (empty at its end), within `idle_s` and the deadline."""
    idle_until = asyncio.get_running_loop().time() + idle_s
    try:
        async with asyncio.timeout_at(min(idle_until, deadline)):
            return await content.readany()
    except TimeoutError:
        # 408 either way: the request itself did not arrive in time.
        if deadline <= idle_until:
            raise BodyTimeout(
                f"the request's deadline passed with {held} bytes of the body read"
            ) from None
        raise BodyTimeout(f"no body bytes for {idle_s:g} s after {held} bytes") from None
