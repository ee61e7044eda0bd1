"""`carpool.generate_stream` against the events of servers other than carpool's sidecar."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest
from aiohttp import web
from support.http_app import serving

import carpool

PIECES = [" on", " the", " mat"]


def triton_events() -> list[bytes]:
    """Triton's events carry no `done`: the stream's end is the answer's."""
    return [
        b"data: " + orjson.dumps({"model_name": "m", "model_version": "1", "text_output": piece})
        for piece in PIECES
    ]


def cut_events() -> list[bytes]:
    """A server that marks its last event `done` and breaks off before it."""
    return [b"data: " + orjson.dumps({"text_output": piece, "done": False}) for piece in PIECES[:2]]


def not_json_events() -> list[bytes]:
    return [b"data: {not json"]


def number_events() -> list[bytes]:
    return [b"data: 5"]


def no_text_events() -> list[bytes]:
    return [b'data: {"model_name": "m"}']


def number_text_events() -> list[bytes]:
    return [b'data: {"text_output": 5}']


@asynccontextmanager
async def server(events: Callable[[], list[bytes]], dies: bool = False) -> AsyncIterator[str]:
    """Serves `events`, then ends its answer, or (`dies`) drops the connection."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events():
            await response.write(event + b"\n\n")
        if dies:
            assert request.transport is not None
            request.transport.abort()
        else:
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v2/models/m/generate_stream", handler)
    async with serving(app) as url:
        yield url


async def test_a_stream_without_done_events_ends_with_its_body() -> None:
    async with server(triton_events) as url, aiohttp.ClientSession() as http:
        events = [event async for event in carpool.generate_stream(http, url, "m", "the cat sat")]
    assert [event.text for event in events] == PIECES


async def test_a_stream_cut_before_its_done_event_fails() -> None:
    async with server(cut_events) as url, aiohttp.ClientSession() as http:
        with pytest.raises(carpool.StreamError, match="before its last event"):
            async for _ in carpool.generate_stream(http, url, "m", "the cat sat"):
                pass


@pytest.mark.parametrize(
    ("events", "dies"),
    [
        (triton_events, True),
        (not_json_events, False),
        (number_events, False),
        (no_text_events, False),
        (number_text_events, False),
    ],
)
async def test_a_server_that_dies_or_garbles_its_stream_raises_stream_error(
    events: Callable[[], list[bytes]], dies: bool
) -> None:
    async with server(events, dies) as url, aiohttp.ClientSession() as http:
        with pytest.raises(carpool.StreamError, match="broke off") as broken:
            async for _ in carpool.generate_stream(http, url, "m", "the cat sat"):
                pass
    assert broken.value.status == 200


async def test_an_answer_that_is_no_event_stream_raises_stream_error() -> None:
    """A server that answers the route with a plain body (a generate answer, a page): no
    events to read, which is no empty answer."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"text_output": "".join(PIECES)})

    app = web.Application()
    app.router.add_post("/v2/models/m/generate_stream", handler)
    async with serving(app) as url, aiohttp.ClientSession() as http:
        with pytest.raises(carpool.StreamError, match="application/json, not an event stream"):
            async for _ in carpool.generate_stream(http, url, "m", "the cat sat"):
                pass
