"""`carpool bench` fails when a load level got no successful answer, and only then."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp import web
from click.testing import CliRunner, Result
from support.http_app import serving

from carpool.loadgen.main import command as bench


async def bench_against(statuses: itertools.cycle[int]) -> Result:
    """`carpool bench` of three requests at one client each against a server that answers
    inference with the next of `statuses`."""

    async def infer(request: web.Request) -> web.Response:
        return web.Response(status=next(statuses))

    app = web.Application()
    app.router.add_post("/v2/models/toy/infer", infer)
    async with serving(app) as url:
        options = ["--url", url, "--metrics-url", "none", "--concurrency", "1", "--requests", "3"]
        options += ["--warmup", "0", "--quiet"]
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
