"""A background task of the sidecar that dies takes the sidecar out of service, loudly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from carpool.engine.batcher import Batcher
from carpool_sidecar.app import create_app
from carpool_sidecar.config import SidecarConfig


async def test_dead_dispatcher_makes_the_sidecar_not_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def crash(self: Batcher) -> None:
        raise RuntimeError("dispatcher bug")

    # Fault injection: no real input makes the dispatcher fail.
    monkeypatch.setattr(Batcher, "run", crash)
    config = SidecarConfig(model_name="toy", model_server=f"unix://{tmp_path / 'none.sock'}")
    app = await create_app(config, CollectorRegistry())
    with caplog.at_level(logging.ERROR):
        async with TestClient(TestServer(app)) as client:
            for path in ("/v2/health/live", "/v2/health/ready"):
                async with client.get(path) as reply:
                    assert reply.status == 503, path
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": [1]}]}
            async with client.post("/v2/models/toy/infer", json=body) as reply:
                assert reply.status == 503
                error = (await reply.json())["error"]
                assert "dispatcher" in error and "dispatcher bug" not in error
    assert "dispatcher bug" in caplog.text
