"""The servers' event loop: uvloop where it is installed, asyncio's on request or without it."""

from __future__ import annotations

import asyncio
import sys

import pytest

from carpool import event_loop

# A dependency of carpool, except on Windows.
uvloop = pytest.importorskip("uvloop")


async def loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_uvloop_runs_the_servers_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.run(loop_type()) is uvloop.Loop


def test_the_environment_can_ask_for_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert not issubclass(event_loop.run(loop_type()), uvloop.Loop)


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    monkeypatch.setenv(event_loop.ENV, "auto")
    assert not issubclass(event_loop.run(loop_type()), uvloop.Loop)
    with pytest.raises(ImportError):
        event_loop.loop_factory("uvloop")


def test_an_unknown_loop_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="CARPOOL_EVENT_LOOP='trio'"):
        event_loop.loop_factory("trio")
