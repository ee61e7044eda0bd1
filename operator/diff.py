"""Does a live object already hold what we render? Only fields we set count.

The API server adds defaults (a Service's clusterIP, a probe's scheme, a container's
terminationMessagePath) and rewrites quantities ("1000m" becomes "1"); none of that is drift.
Anything we render that differs, or is missing, is.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
# Where resource quantities live, which the API server canonicalises.
_QUANTITY_MAPS = {"limits", "requests"}
_QUANTITY_KEYS = {"averageValue"}


def quantity(text: str) -> Decimal | None:
    match = _QUANTITY.match(text)
    if not match:
        return None
    try:
        number = Decimal(match.group(1))
    except ArithmeticError:
        return None
    return number * _SUFFIX.get(match.group(2) or "", Decimal(1))


def _same_scalar(actual: Any, desired: Any, is_quantity: bool) -> bool:
    if actual == desired and type(actual) is type(desired):
        return True
    if is_quantity and isinstance(actual, str | int) and isinstance(desired, str):
        left, right = quantity(str(actual)), quantity(desired)
        return left is not None and left == right
    return False


def contains(actual: Any, desired: Any, key: str = "", parent: str = "") -> bool:
    """True when every field of `desired` is in `actual` with the same value."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return False
        return all(
            name in actual and contains(actual[name], value, name, key)
            for name, value in desired.items()
        )
    if isinstance(desired, list):
        # Lists are ours whole: same length, each item containing ours in order.
        if not isinstance(actual, list) or len(actual) != len(desired):
            return False
        return all(contains(a, d, key, parent) for a, d in zip(actual, desired, strict=True))
    is_quantity = parent in _QUANTITY_MAPS or key in _QUANTITY_KEYS
    return _same_scalar(actual, desired, is_quantity)
