"""Values for the knobs of the contract's table, for tests that walk every knob."""

from __future__ import annotations

from carpool.contract.batching import Knob


def other_value(knob: Knob) -> int | str:
    """A valid value of the knob that is not its default."""
    if knob.choices:
        return next(choice for choice in knob.choices if choice != knob.default)
    return knob.minimum if knob.default != knob.minimum else knob.minimum + 1
