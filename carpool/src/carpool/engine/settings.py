"""The batching knobs as the engine runs them: typed, frozen, validated.

Errors name the key, its flag and its environment variable, and the value. A settings file
(a ConfigMap in a pod) lays its keys over the flags: `apply_file`.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from carpool.contract.batching import KNOB_BY_KEY, KNOBS, Batching


class ConfigError(ValueError):
    """A setting with a bad value; the message names the key and the value."""


@dataclass(frozen=True, slots=True)
class BatchingSettings(Batching):
    """The contract's batching knobs as the sidecar runs them, each checked on creation."""

    def __post_init__(self) -> None:
        for knob in KNOBS:
            value = getattr(self, knob.attribute)
            problem = knob.problem(value)
            if problem is not None:
                raise ConfigError(f"{key_name(knob.key)}: {problem}, got {value!r}")


def key_name(key: str) -> str:
    """How errors name a batching setting: its file key, flag and environment variable."""
    knob = KNOB_BY_KEY.get(key)
    if knob is None:
        return key
    return f"{key} (--{knob.attribute.replace('_', '-')}, CARPOOL_{knob.attribute.upper()})"


def apply_file(base: BatchingSettings, content: bytes) -> BatchingSettings:
    """The settings of a settings-file body laid over `base`; ConfigError when it is bad."""
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError as error:
        raise ConfigError(f"settings file is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"settings file must hold a JSON object, got {document!r}")
    unknown = sorted(set(document) - set(KNOB_BY_KEY))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key (known: {sorted(KNOB_BY_KEY)})")
    # Values are JSON of any type until BatchingSettings.__post_init__ checks them.
    return base.overlay(document)
