"""Start-up objects frozen: later full collections walk only what serving made since."""

from __future__ import annotations

import gc

from carpool.heap import collect_young_less_often, freeze_startup


def test_objects_alive_at_the_freeze_are_left_out_of_later_collections() -> None:
    held = [[index] for index in range(10_000)]  # a server's modules, model and app
    try:
        freeze_startup()
        assert gc.get_freeze_count() >= len(held)
        # A full pass keeps in its oldest generation only what was made since.
        made_since = [[index] for index in range(100)]
        gc.collect()
        assert len(made_since) <= len(gc.get_objects(generation=2)) < len(held) // 10
    finally:
        gc.unfreeze()


def test_requests_in_flight_start_no_young_collection() -> None:
    before = gc.get_threshold()
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        collect_young_less_often()
        assert gc.get_threshold()[1:] == before[1:]
        gc.collect()
        started.clear()
        # 64 callers' objects come and go, 2,000 alive at the peak, 100 times over.
        for _ in range(100):
            in_flight = [[index] for index in range(2_000)]
            del in_flight
        assert started == []
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)
