"""One bisection for the model server and `carpool.batch`: only the items that fail alone fail."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from carpool.engine import bisection


class Poisoned(Exception):
    pass


class Broken(Exception):
    """A bug of the batch function: smaller batches would not mend it."""


def test_a_batch_that_succeeds_runs_once() -> None:
    runs: list[Sequence[int]] = []

    def attempt(batch: Sequence[int]) -> bisection.Outcome[int | str]:
        runs.append(batch)
        return [2 * n for n in batch]

    plan = bisection.isolate(list(range(8)), failed=str, splits=lambda error: True)
    assert bisection.run(plan, attempt) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert runs == [list(range(8))]


def test_one_poison_item_fails_alone_in_about_two_log2_n_runs() -> None:
    runs: list[Sequence[int]] = []

    def attempt(batch: Sequence[int]) -> bisection.Outcome[int | str]:
        runs.append(batch)
        if 5 in batch:
            return Poisoned(f"poison among {len(batch)}")
        return [2 * n for n in batch]

    plan = bisection.isolate(list(range(16)), failed=repr, splits=lambda error: True)
    results = bisection.run(plan, attempt)
    assert results[:5] == [0, 2, 4, 6, 8] and results[6:] == [2 * n for n in range(6, 16)]
    assert results[5] == repr(Poisoned("poison among 1"))
    # 16 → 8 → 4 → 2 → 1 on the poisoned side, one good half at each level.
    assert len(runs) == 1 + 2 * 4


def test_an_error_that_does_not_split_fails_the_whole_batch_at_once() -> None:
    runs: list[Sequence[int]] = []

    def attempt(batch: Sequence[int]) -> bisection.Outcome[str]:
        runs.append(batch)
        return Broken("3 results for 4 items")

    plan = bisection.isolate(
        [1, 2, 3, 4], failed=str, splits=lambda error: not isinstance(error, Broken)
    )
    assert bisection.run(plan, attempt) == ["3 results for 4 items"] * 4
    assert len(runs) == 1


def test_the_async_driver_runs_the_same_plan() -> None:
    runs: list[Sequence[int]] = []

    async def attempt(batch: Sequence[int]) -> bisection.Outcome[int | str]:
        await asyncio.sleep(0)
        runs.append(batch)
        return Poisoned() if 0 in batch or 3 in batch else list(batch)

    plan = bisection.isolate([0, 1, 2, 3], failed=lambda e: "failed", splits=lambda e: True)
    assert asyncio.run(bisection.run_async(plan, attempt)) == ["failed", 1, 2, "failed"]
    assert runs == [[0, 1, 2, 3], [0, 1], [0], [1], [2, 3], [2], [3]]
