"""The sidecar's configuration: typed, frozen, validated; errors name the key and the value.

Batching knobs come from flags or `CARPOOL_*` environment variables (click resolves those),
then from the optional JSON settings file, whose camelCase keys are those of
`spec.batching` (docs/architecture.md). Precedence: file > flag > environment > default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Dispatch = Literal["adaptive", "fixed"]
DISPATCH_MODES: tuple[Dispatch, ...] = ("adaptive", "fixed")


class ConfigError(ValueError):
    """A setting with a bad value; the message names the key and the value."""


@dataclass(frozen=True, slots=True)
class BatchingSettings:
    """The knobs of the batching engine; replaced whole when the settings file changes."""

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_inflight_batches: int = 2
    max_queue_items: int = 1024
    timeout_ms: float = 30_000.0
    dispatch: Dispatch = "adaptive"
    # Sum of padded lengths allowed in one batch of variable-length items; 0 means no budget.
    max_batch_tokens: int = 0

    def __post_init__(self) -> None:
        _at_least("maxBatchSize", self.max_batch_size, 1)
        _at_least("maxWaitMs", self.max_wait_ms, 0)
        _at_least("maxInflightBatches", self.max_inflight_batches, 1)
        _at_least("maxQueueItems", self.max_queue_items, 1)
        _at_least("timeoutMs", self.timeout_ms, 1)
        _at_least("maxBatchTokens", self.max_batch_tokens, 0)
        if self.dispatch not in DISPATCH_MODES:
            raise ConfigError(
                f"{key_name('dispatch')}: must be one of {list(DISPATCH_MODES)}, "
                f"got {self.dispatch!r}"
            )

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000


# camelCase key of the settings file -> field of BatchingSettings
FILE_KEYS: dict[str, str] = {
    "maxBatchSize": "max_batch_size",
    "maxWaitMs": "max_wait_ms",
    "maxInflightBatches": "max_inflight_batches",
    "maxQueueItems": "max_queue_items",
    "timeoutMs": "timeout_ms",
    "dispatch": "dispatch",
    "maxBatchTokens": "max_batch_tokens",
}
_INTEGER_KEYS = frozenset(["maxBatchSize", "maxInflightBatches", "maxQueueItems", "maxBatchTokens"])


def key_name(key: str) -> str:
    """How errors name a batching setting: its file key, flag and environment variable."""
    field = FILE_KEYS.get(key)
    if field is None:
        return key
    return f"{key} (--{field.replace('_', '-')}, CARPOOL_{field.upper()})"


def _at_least(key: str, value: float, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise ConfigError(f"{key_name(key)}: must be a number >= {low}, got {value!r}")


def apply_file(base: BatchingSettings, content: bytes) -> BatchingSettings:
    """The settings of a settings-file body laid over `base`; ConfigError when it is bad."""
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError as error:
        raise ConfigError(f"settings file is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"settings file must hold a JSON object, got {document!r}")
    # Values are JSON of any type until BatchingSettings.__post_init__ validates them.
    changes: dict[str, Any] = {}
    for key, value in document.items():
        field = FILE_KEYS.get(key)
        if field is None:
            raise ConfigError(f"{key}: unknown key (known: {sorted(FILE_KEYS)})")
        if key in _INTEGER_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key_name(key)}: must be an integer, got {value!r}")
        changes[field] = value
    return dataclasses.replace(base, **changes)


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """Everything `carpool sidecar` needs; built once in `main()`."""

    model_name: str
    model_server: str
    host: str = "127.0.0.1"
    port: int = 8080
    config_file: str | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    drain_seconds: float = 30.0
    batching: BatchingSettings = dataclasses.field(default_factory=BatchingSettings)
    # gRPC front (sidecar/grpc): port 0 turns it off; message limit None: max_body_bytes.
    grpc_port: int = 8081
    grpc_max_message_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ConfigError("model-name: must not be empty")
        if not self.model_server.startswith(("unix://", "http://")):
            raise ConfigError(
                f"model-server: must start with unix:// or http://, got {self.model_server!r}"
            )
        _at_least("port", self.port, 0)
        _at_least("max-body-bytes", self.max_body_bytes, 1)
        _at_least("drain-seconds", self.drain_seconds, 0)
        _at_least("grpc-port", self.grpc_port, 0)
        if self.grpc_max_message_bytes is not None:
            _at_least("grpc-max-message-bytes", self.grpc_max_message_bytes, 1)

    @property
    def grpc_message_limit(self) -> int:
        """Largest gRPC message in either direction: by default the REST body limit."""
        return self.grpc_max_message_bytes or self.max_body_bytes
