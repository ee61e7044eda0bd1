"""Streamed generation as a caller reads it: an async iterator over the Server-Sent Events of
`POST /v2/models/{model}/generate_stream` (the Open Inference Protocol's generate extension),
from a carpool sidecar or any server that speaks the extension.

    async with aiohttp.ClientSession() as http:
        async for event in carpool.generate_stream(http, url, "gpt", "the cat", max_tokens=16):
            print(event.text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

# Of an error's body, read at most this much.
MAX_ERROR_BYTES = 1 << 16
_DATA = b"data:"
EVENT_STREAM = "text/event-stream"


class StreamError(Exception):
    """The server refused the request (`status`), or broke the stream off (status 200)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(f"{status}: {message}")
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One piece of the answer; the last one (`done`) says how the answer ended, where the
    server tells it. A server that marks no event `done` (Triton) ends its answer with its
    stream: the iteration's end is then the answer's."""

    text: str
    done: bool
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None


async def generate_stream(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    text_input: str,
    **parameters: Any,
) -> AsyncIterator[StreamEvent]:
    """The answer to one prompt, event by event; `parameters` as the extension's
    (`max_tokens`, `temperature`, `stop`, and carpool's `priority` and `timeout`). Leaving
    the loop early closes the connection, which ends the sequence on the server."""
    body = orjson.dumps({"text_input": text_input, "parameters": parameters})
    target = f"{url.rstrip('/')}/v2/models/{model}/generate_stream"
    # Servers that mark their last event `done` (carpool's sidecar) have broken off when the
    # stream ends without it; for those that do not (Triton), the stream's end is the answer's.
    marks_done = False
    async with session.post(target, data=body) as reply:
        if reply.status != 200:
            raise StreamError(_error_of(await reply.content.read(MAX_ERROR_BYTES)), reply.status)
        if reply.content_type != EVENT_STREAM:  # no events to read: no empty answer either
            head = (await reply.content.read(300)).decode(errors="replace")
            message = f"the server answered {reply.content_type}, not an event stream: {head}"
            raise StreamError(message, reply.status)
        async for line in _lines(reply):
            if not line.startswith(_DATA):
                continue  # the blank line between events, or a comment
            try:
                event = orjson.loads(line[len(_DATA) :])
            except orjson.JSONDecodeError as error:
                message = f"the stream broke off: an event is not JSON: {error}"
                raise StreamError(message, reply.status) from error
            if not isinstance(event, dict):
                message = f"the stream broke off: an event is not a JSON object: {event!r:.100}"
                raise StreamError(message, reply.status)
            if "error" in event:
                raise StreamError(str(event["error"]), reply.status)
            if not isinstance(text := event.get("text_output"), str):
                message = f"the stream broke off: an event has no text_output string: {text!r:.100}"
                raise StreamError(message, reply.status)
            marks_done = marks_done or "done" in event
            yield StreamEvent(
                text=text,
                done=bool(event.get("done", False)),
                finish_reason=event.get("finish_reason"),
                prompt_tokens=event.get("prompt_tokens"),
                generated_tokens=event.get("generated_tokens"),
            )
            if event.get("done"):
                return
    if marks_done:
        raise StreamError("the stream ended before its last event", 200)


async def _lines(reply: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The answer's lines; StreamError when the connection breaks off, or a line is past
    aiohttp's bound."""
    try:
        async for line in reply.content:
            yield line
    except (aiohttp.ClientPayloadError, aiohttp.http_exceptions.LineTooLong) as error:
        raise StreamError(f"the stream broke off: {error}", reply.status) from error


def _error_of(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:300].decode(errors="replace")
