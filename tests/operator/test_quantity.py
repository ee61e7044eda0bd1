"""Quantities in the form the API server stores them.

The expected forms are those of k8s.io/apimachinery's own tests (resource/quantity_test.go:
TestQuantityParse, TestQuantityString, TestQuantityParseEmit).
"""

from __future__ import annotations

import pytest

from carpool_operator.quantity import canonical

STORED = {
    # Decimal: the largest exponent, a multiple of 3, that keeps the value whole.
    "0.0001": "100u",
    "0.5": "500m",
    "1.08": "1080m",
    "5000m": "5",
    "1000u": "1m",
    "1080000000n": "1080m",
    "0.001T": "1G",
    "1.2e3": "1200",
    "1.3E+6": "1300e3",
    ".001e12": "1e9",
    "1000e-12": "1e-9",
    "00": "0",
    "0m": "0",
    "-5000m": "-5",
    # Finer than a nano: rounded up, away from zero.
    "0.0000000001": "1n",
    "3.001n": "4n",
    "0.00000012345": "124n",
    "1.1E-9": "2e-9",
    # Binary: the largest power of 1024, unless under 1024 or not whole.
    "1.5Gi": "1536Mi",
    "1024Ki": "1Mi",
    "307200Ki": "300Mi",
    "0.5Ki": "512",
    ".001Ki": "1024m",
    ".000000000001Ki": "2n",
    "-1024Mi": "-1Gi",
    "9Ei": "9223372036854775807",  # capped at 2^63-1
    # Kept as written: the parser's fast path finds them canonical already.
    "500m": "500m",
    "1E3": "1E3",
    "0500m": "0500m",
    "100.035k": "100.035k",
    "1025Ki": "1025Ki",
}


@pytest.mark.parametrize("written", sorted(STORED))
def test_quantities_take_the_api_servers_form(written: str) -> None:
    assert canonical(written) == STORED[written]


@pytest.mark.parametrize("stored", sorted(set(STORED.values())))
def test_the_stored_form_is_stable(stored: str) -> None:
    assert canonical(stored) == stored


@pytest.mark.parametrize("text", ["", ".", "1e", "1KI", "one", "1.5.0", "--1"])
def test_what_is_no_quantity(text: str) -> None:
    assert canonical(text) is None
