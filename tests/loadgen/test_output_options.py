"""`carpool bench` and `carpool tune` refuse, before any load, what would fail or hang only
once the load is over: a report file in a folder that is not there, no request timeout; and
a target's /metrics that is not text does not end the run."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import click
import pytest
from aiohttp import web
from support.http_app import serving

from carpool.loadgen import runner
from carpool.loadgen.main import command as bench
from carpool.tune.main import command as tune


def refusal(command: click.Command, *args: str) -> str:
    with pytest.raises(click.BadParameter) as raised, command.make_context("carpool", list(args)):
        pass
    return raised.value.format_message()


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_refuses_a_report_in_a_missing_folder(tmp_path: Path, flag: str) -> None:
    message = refusal(bench, flag, str(tmp_path / "missing" / "report"))
    assert f"'{flag}'" in message and "missing" in message


@pytest.mark.parametrize("flag", ["--json", "--plot", "--snippet"])
def test_tune_refuses_a_report_in_a_missing_folder(tmp_path: Path, flag: str) -> None:
    required = ["--settings-file", str(tmp_path / "b.json"), "--objective-ms", "50"]
    message = refusal(tune, *required, flag, str(tmp_path / "missing" / "report"))
    assert f"'{flag}'" in message and "missing" in message


@pytest.mark.parametrize("seconds", ["0", "-1"])
def test_bench_refuses_a_timeout_that_is_none(seconds: str) -> None:
    # aiohttp takes 0 or less as no timeout at all: a server that hangs would hang the bench.
    assert "'--timeout'" in refusal(bench, "--timeout", seconds)


def test_a_report_beside_the_working_folder_is_taken(tmp_path: Path) -> None:
    with bench.make_context("carpool", ["--json", str(tmp_path / "r.json")]) as context:
        assert context.params["json_path"] == tmp_path / "r.json"


async def test_metrics_that_are_not_text_are_no_metrics() -> None:
    # Another server's /metrics (bench loads "any OIP server"): bytes that are not UTF-8.
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xfe carpool", content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url, aiohttp.ClientSession() as session:
        assert await runner.read_metrics(session, url + "/metrics") is None
