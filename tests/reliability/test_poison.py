"""A poison item (one that makes the model raise) fails only its own caller.

The model server isolates it by bisection (docs/model-server.md): the failing batch is split
in halves and rerun until the failing item stands alone. Checked at the model server for any
placement of poison and invalid items, and end to end through the sidecar, where poison
shares one batch with other callers' good items (`poison.broken_promises`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reliability.poison import Plan, broken_promises, run, summary
from reliability.soaked import soaked
from support.model_server import ModelServer, post_batch, run_model_server

from carpool.contract.wire import Tensor

GOOD, POISON, INVALID = "good", "poison", "invalid"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    with run_model_server(tmp_path_factory.mktemp("poison"), "toy") as running:
        yield running


def toy_item(row: list[float]) -> dict[str, Tensor]:
    return {"input": Tensor.from_numpy(np.array(row, dtype=np.float32))}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([GOOD, GOOD, GOOD, POISON, INVALID]), min_size=1, max_size=64))
def test_model_server_answers_each_item_for_any_poison_placement(
    server: ModelServer, kinds: list[str]
) -> None:
    rows = [[float(i), -1.0, 0.5, 2.0] for i in range(len(kinds))]
    for row, kind in zip(rows, kinds, strict=True):
        row[1] = {GOOD: row[1], POISON: math.nan, INVALID: math.inf}[kind]
    results = asyncio.run(post_batch(server, [toy_item(row) for row in rows]))

    assert len(results) == len(kinds)
    for row, kind, result in zip(rows, kinds, results, strict=True):
        if kind == GOOD:
            assert result.error is None and result.outputs is not None
            assert result.outputs["output"].to_numpy().tolist() == [2 * v + 1 for v in row]
        elif kind == POISON:
            assert result.status == 500 and result.error is not None and "NaN" in result.error
        else:
            assert result.status == 400 and result.error is not None and "finite" in result.error


def test_poison_in_a_shared_batch_fails_only_its_caller(tmp_path: Path) -> None:
    plan = soaked(Plan(rounds=3, callers=24, poisoned_per_round=2))
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken[:10]}\n{summary(report)}"
