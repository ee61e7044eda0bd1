"""Resource quantities as the API server stores them (k8s.io/apimachinery `resource.Quantity`).

The API server parses each quantity and writes it back in its canonical form: "1.5" becomes
"1500m", "0.0001" "100u", "1.5Gi" "1536Mi", "1024Ki" "1Mi"; a value finer than 1n is
rounded up to it. `canonical` computes that form exactly (no floating point), so that what
carpool renders compares equal to what the API server stored.

Mirrored from `quantity.go` (`ParseQuantity`, `CanonicalizeBytes`) and `amount.go`: the
suffix kind (binary, decimal, exponent) is remembered; a decimal value gets the largest
exponent, a multiple of 3, that keeps it whole; a binary one the largest power of 1024, unless
it is under 1024 or not whole (then decimal); a binary value is capped at 2^63-1; and a string
the parser already finds canonical (its digits without a leading zero or three trailing zeros,
a decimal exponent that is a multiple of 3) is kept as written, even "0500m".
"""

from __future__ import annotations

import re

_FORM = re.compile(
    r"^([+-]?)([0-9]*)(?:\.([0-9]*))?"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE]?)|[eE](?P<exponent>[+-]?[0-9]+))$"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_NANO = -9
_MAX_BINARY = 2**63 - 1
# The parser's int64 fast path holds at most this many digits.
_FAST_DIGITS = 18


def _kept_as_written(match: re.Match[str], digits: str, scale: int) -> bool:
    """Whether the parser's fast path keeps the string as written (quantity.go)."""
    if match["binary"] is not None:
        exponent = _BINARY[match["binary"]]
        fits = 15 - len(digits) - int(exponent * 3 / 10) - 1 >= 0
        return fits and not match[3] and exponent % 10 == 0 and int(digits) & 7 != 0
    fits = len(digits) <= _FAST_DIGITS and scale >= _NANO
    return fits and scale % 3 == 0 and not digits.endswith("000") and digits[0] != "0"


def _decimal(mantissa: int, exponent: int, *, exponent_form: bool) -> str:
    """mantissa * 10**exponent with the largest exponent, a multiple of 3, keeping it whole."""
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    if exponent_form or exponent not in _DECIMAL_SUFFIX:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def canonical(text: str) -> str | None:
    """The form the API server stores the quantity `text` in; None if it is not a quantity."""
    match = _FORM.match(text)
    if match is None or not (match[2] or match[3]):
        return None
    whole, fraction = match[2].lstrip("0") or "0", match[3] or ""
    digits = whole + fraction
    if match["binary"] is not None:
        scale = -len(fraction)
    elif match["exponent"] is not None:
        scale = int(match["exponent"]) - len(fraction)
    else:
        scale = _DECIMAL[match["decimal"]] - len(fraction)
    if _kept_as_written(match, digits, scale):
        return text
    sign = -1 if match[1] == "-" else 1
    # The value is mantissa * 10**scale, exactly.
    mantissa = int(digits)
    if match["binary"] is not None:
        mantissa <<= _BINARY[match["binary"]]
    if mantissa == 0:
        return "0"
    if scale < _NANO:  # rounded up, away from zero, to whole nanos
        mantissa, scale = -(-mantissa // 10 ** (_NANO - scale)), _NANO
    if match["binary"] is None:
        return _decimal(sign * mantissa, scale, exponent_form=match["exponent"] is not None)
    if scale >= 0:
        mantissa *= 10**scale
        scale = 0
    if mantissa > _MAX_BINARY * 10**-scale:
        mantissa, scale = _MAX_BINARY, 0
    whole_value = scale == 0 or mantissa % 10**-scale == 0
    if not whole_value or mantissa < 1024 * 10**-scale:
        return _decimal(sign * mantissa, scale, exponent_form=False)
    value, power = mantissa // 10**-scale, 0
    while value % 1024 == 0:
        value //= 1024
        power += 1
    return f"{sign * value}{_BINARY_SUFFIX[power]}"
