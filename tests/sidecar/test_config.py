"""`carpool sidecar` settings from CARPOOL_* environment variables and the settings file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from support.sidecar import infer, metric, run_pair

from carpool.contract.batching import KNOBS, Knob
from carpool.engine.settings import BatchingSettings, ConfigError, apply_file


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
    env = {**os.environ, variable: value}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and value in done.stderr


@pytest.mark.parametrize("knob", [k for k in KNOBS if not k.choices], ids=lambda k: k.key)
def test_the_settings_file_holds_each_knob_to_the_contracts_bounds(knob: Knob) -> None:
    base = BatchingSettings()
    for value in (knob.minimum, knob.maximum):
        settings = apply_file(base, orjson.dumps({knob.key: value}))
        assert getattr(settings, knob.attribute) == value
    for value in (knob.minimum - 1, knob.maximum + 1):
        with pytest.raises(ConfigError, match=rf"{knob.key}.*got {value}"):
            apply_file(base, orjson.dumps({knob.key: value}))


def test_waits_take_fractions_of_a_millisecond_and_sizes_do_not() -> None:
    settings = apply_file(BatchingSettings(), b'{"maxWaitMs": 0.5, "timeoutMs": 1.5}')
    assert (settings.max_wait_s, settings.timeout_ms) == (0.0005, 1.5)
    with pytest.raises(ConfigError, match=r"maxQueueItems.*an integer"):
        apply_file(BatchingSettings(), b'{"maxQueueItems": 10.5}')
