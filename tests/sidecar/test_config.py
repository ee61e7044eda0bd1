"""`carpool sidecar` settings from CARPOOL_* environment variables, and their errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from support.sidecar import infer, metric, run_pair


async def test_environment_sets_the_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARPOOL_MAX_BATCH_SIZE", "2")
    with run_pair(tmp_path, "toy") as pair:
        async with aiohttp.ClientSession() as http:
            status, body = await infer(http, pair.sidecar, [[float(i)] * 4 for i in range(5)])
        assert status == 200, body
        assert metric(pair.sidecar, "carpool_batch_size_count") == 3  # 2 + 2 + 1


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("CARPOOL_MAX_BATCH_SIZE", "0", "maxBatchSize"),
        ("CARPOOL_TIMEOUT_MS", "-5", "timeoutMs"),
        ("CARPOOL_MAX_WAIT_MS", "soon", "max-wait-ms"),
        ("CARPOOL_DISPATCH", "sometimes", "dispatch"),
    ],
)
def test_bad_environment_value_is_a_usage_error_naming_it(
    variable: str, value: str, named: str
) -> None:
    command = [sys.executable, "-m", "carpool", "sidecar", "--model-name", "toy"]
    env = {**os.environ, "PYTHONSAFEPATH": "1", variable: value}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and value in done.stderr
