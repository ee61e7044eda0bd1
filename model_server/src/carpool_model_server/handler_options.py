"""The values of `--handler-options` the built-in handlers take, checked in `__init__`.

Each returns None for an option not given and raises ValueError naming the key and the
value for a bad one (the server then stops with a message naming `--handler-options`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

_BOOLEANS = {"true": True, "false": False}


def positive_option(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if not value.isdecimal() or int(value) < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def boolean_option(options: Mapping[str, str], key: str) -> bool | None:
    value = options.get(key)
    if value is None:
        return None
    if value not in _BOOLEANS:
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return _BOOLEANS[value]


def choice_option(options: Mapping[str, str], key: str, choices: Sequence[str]) -> str | None:
    value = options.get(key)
    if value is not None and value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value
