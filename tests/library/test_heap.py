"""Start-up objects frozen: later full collections walk only what serving made since."""

from __future__ import annotations

import gc

from carpool.heap import freeze_startup


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
