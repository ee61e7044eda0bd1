"""`carpool tune` waits until the sidecar uses the settings it wrote, and no longer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from support.http_app import serving

from carpool.tune.trial import NotApplied, until_applied


@asynccontextmanager
async def batching_url(app: web.Application) -> AsyncIterator[str]:
    async with serving(app) as url:
        yield f"{url}/v2/models/m/batching"


async def test_tune_goes_on_as_soon_as_the_sidecar_uses_the_settings() -> None:
    in_use: dict[str, float | str] = {"maxBatchSize": 32, "maxWaitMs": 5.0}

    async def batching(request: web.Request) -> web.Response:
        return web.json_response({"batching": in_use})

    app = web.Application()
    app.router.add_get("/v2/models/m/batching", batching)
    async with batching_url(app) as url, aiohttp.ClientSession() as session:
        asyncio.get_running_loop().call_later(
            0.3, in_use.update, {"maxBatchSize": 8, "maxWaitMs": 2.0}
        )
        started = time.monotonic()
        # Written as integers, reported as the sidecar holds them: equal all the same.
        await until_applied(session, url, {"maxBatchSize": 8, "maxWaitMs": 2})
        waited = time.monotonic() - started
    assert 0.3 <= waited < 1.0


async def test_a_sidecar_that_does_not_report_its_settings_stops_tune() -> None:
    async with batching_url(web.Application()) as url, aiohttp.ClientSession() as session:
        with pytest.raises(NotApplied, match="404"):
            await until_applied(session, url, {"maxBatchSize": 8})
