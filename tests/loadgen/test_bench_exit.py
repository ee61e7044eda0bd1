"""`carpool bench` fails when a load level got no successful answer, and only then."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp import web
from click.testing import CliRunner, Result
from support.http_app import serving

from carpool.loadgen.main import command as bench


async def bench_against(statuses: itertools.cycle[int], *load: str) -> Result:
    """`carpool bench` (default load: three requests at one client) against a server that
    answers inference with the next of `statuses`."""

    async def infer(request: web.Request) -> web.Response:
        return web.Response(status=next(statuses))

    app = web.Application()
    app.router.add_post("/v2/models/toy/infer", infer)
    async with serving(app) as url:
        options = ["--url", url, "--metrics-url", "none", "--warmup", "0", "--quiet"]
        options += load or ["--concurrency", "1", "--requests", "3"]
        return await asyncio.to_thread(CliRunner().invoke, bench, options)


async def test_bench_fails_when_no_request_succeeded() -> None:
    result = await bench_against(itertools.cycle([503]))
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == "Error: no request succeeded at c=1"
    assert "503:3" in result.output  # the report still came first


async def test_bench_passes_when_some_requests_failed() -> None:
    result = await bench_against(itertools.cycle([200, 503]))
    assert result.exit_code == 0, result.output
    assert "503:1" in result.output


async def test_bench_passes_at_a_level_that_sent_nothing() -> None:
    """An open loop of 0.2 requests/s for 2 s (seed 0) schedules no arrival: nothing failed."""
    result = await bench_against(itertools.cycle([503]), "--rate", "0.2", "--duration", "2")
    assert result.exit_code == 0, result.output
