"""Each scenario's test runs it small; `bench/soak.py` runs the same test with bigger numbers.

The soak passes its numbers in CARPOOL_SOAK_PLAN (JSON: field name -> value as typed on its
command line); a test hands its own small Plan to `soaked`, which lays them over it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PLAN_VARIABLE = "CARPOOL_SOAK_PLAN"  # bench/soak.py sets it
PlanT = TypeVar("PlanT", bound="DataclassInstance")


def soaked(plan: PlanT) -> PlanT:
    """`plan` with the soak's numbers in place of its own (unchanged outside a soak)."""
    overrides: dict[str, Any] = json.loads(os.environ.get(PLAN_VARIABLE) or "{}")
    names = {field.name for field in dataclasses.fields(plan)}
    if unknown := sorted(set(overrides) - names):
        raise ValueError(f"{type(plan).__qualname__} has no {unknown}; it has {sorted(names)}")
    # Each value takes the type of the field it replaces: the flags arrive as text.
    changes = {name: type(getattr(plan, name))(value) for name, value in overrides.items()}
    plan = dataclasses.replace(plan, **changes)
    print(f"plan: {plan}")
    return plan
