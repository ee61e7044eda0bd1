"""The stand-in accelerator: its timing as `--handler-options` sets it, and its answers."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from support.model_server import post_batch, run_model_server

from carpool.contract.wire import Item, Tensor
from carpool_model_server.build import build_service
from carpool_model_server.config import parse
from carpool_model_server.errors import ConfigError
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_stand_in import PRESETS, StandInHandler, Timing


def stand_in(**options: str) -> StandInHandler:
    return StandInHandler(HandlerSettings(None, torch.float32, 64, options))


def run_batch(handler: StandInHandler, size: int) -> tuple[list[Item], float]:
    items: list[Item] = [
        {"input": Tensor.from_numpy(np.full(3, i, dtype=np.float32))} for i in range(size)
    ]
    started = time.monotonic()
    prepared = handler.preprocess(items)
    assert prepared.batch is not None
    outputs = handler.postprocess(handler.infer(prepared.batch))
    return [dict(output) for output in outputs], time.monotonic() - started


def test_presets_and_single_keys_over_them() -> None:
    assert stand_in(preset="fast").timing == Timing(fixed_ms=2.0, item_ms=0.05)
    assert stand_in(preset="slow").timing == PRESETS["slow"]
    assert stand_in(preset="fast", item_ms="1").timing == Timing(fixed_ms=2.0, item_ms=1.0)
    assert stand_in().timing == Timing()


def test_a_batch_takes_at_least_fixed_plus_per_item_time() -> None:
    outputs, took = run_batch(stand_in(fixed_ms="30", item_ms="10"), 4)
    assert took >= 0.070
    assert [output["output"].to_numpy().tolist() for output in outputs] == [
        [2 * i + 1] * 3 for i in range(4)
    ]


def test_outliers_take_their_own_time_and_jitter_stays_within_its_band() -> None:
    _, took = run_batch(stand_in(fixed_ms="1", outliers="1", outlier_ms="150"), 2)
    assert took >= 0.150
    timing = Timing(fixed_ms=10.0, item_ms=1.0, jitter=0.5)
    draw = random.Random(1)
    seconds = [timing.seconds(10, draw) for _ in range(200)]
    assert 0.010 <= min(seconds) < 0.012 and 0.028 < max(seconds) <= 0.030


def test_the_same_seed_draws_the_same_times() -> None:
    options = {"fixed_ms": "1", "jitter": "0.5", "outliers": "0.1", "outlier_ms": "50"}
    first, second = stand_in(**options), stand_in(**options)
    draws = [[h.timing.seconds(4, h._draw) for _ in range(50)] for h in (first, second)]
    assert draws[0] == draws[1] and len(set(draws[0])) > 10


@pytest.mark.parametrize(
    "handler,options,message",
    [
        ("stand-in", (("preset", "gpu"),), "preset must be one of fast, slow"),
        ("stand-in", (("fixed_ms", "two"),), "fixed_ms must be a number"),
        ("stand-in", (("jitter", "1.5"),), "jitter is out of range"),
        ("stand-in", (("item_ms", "-1"),), "item_ms is out of range"),
        ("stand-in", (("fixd_ms", "1"),), "takes no option 'fixd_ms'"),
        ("toy", (("preset", "fast"),), "takes no option 'preset' (known: none)"),
        ("text-embedding", (("max_tokens", "²"),), "max_tokens must be a positive integer"),
    ],
)
def test_bad_options_name_the_flag(
    handler: str, options: tuple[tuple[str, str], ...], message: str
) -> None:
    config = parse({"handler": handler, "socket": Path("unused"), "handler_options": options})
    with pytest.raises(ConfigError) as error:
        build_service(config)
    assert "--handler-options (CARPOOL_MODEL_HANDLER_OPTIONS)" in str(error.value)
    assert message in str(error.value)


async def test_the_model_server_serves_it_with_options_from_the_flag(tmp_path: Path) -> None:
    with run_model_server(
        tmp_path, "stand-in", "--handler-options", "fixed_ms=40,item_ms=0"
    ) as server:
        item = {"input": Tensor.from_numpy(np.array([1.0, -1.0], dtype=np.float32))}
        started = asyncio.get_running_loop().time()
        [result] = await post_batch(server, [item])
        assert asyncio.get_running_loop().time() - started >= 0.040
        assert result.outputs is not None
        assert result.outputs["output"].to_numpy().tolist() == [3.0, -1.0]
        [refused] = await post_batch(
            server, [{"input": Tensor.from_numpy(np.array([np.nan], dtype=np.float32))}]
        )
        assert refused.status == 400
