"""The sidecar's configuration: typed, frozen, validated; errors name the key and the value.

Batching knobs come from flags or `CARPOOL_*` environment variables (click resolves those),
then from the optional JSON settings file, whose keys and bounds are the contract's
(`carpool.contract.batching`). Precedence: file > flag > environment > default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from carpool.contract.pod import DRAIN_DELAY_SECONDS, DRAIN_SECONDS, GRPC_PORT, SIDECAR_PORT
from carpool.engine.settings import BatchingSettings, ConfigError

# More fronts than this would starve the one process that batches for them all.
MAX_FRONT_PROCESSES = 64


def _at_least(key: str, value: float, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise ConfigError(f"{key}: must be a number >= {low}, got {value!r}")


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """Everything `carpool sidecar` needs; built once in `main()`."""

    model_name: str
    model_server: str
    host: str = "127.0.0.1"
    port: int = SIDECAR_PORT
    config_file: str | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    # A body that sends nothing for this long gets 408 and its connection closed.
    body_timeout_s: float = 10.0
    # Bytes of bodies being read, across connections, beyond which new requests get 503.
    max_reading_bytes: int = 256 * 1024 * 1024
    # The largest answer (413 above), and the bytes of answers built and not yet sent,
    # across connections, beyond which answers get 503.
    max_answer_bytes: int = 64 * 1024 * 1024
    max_unsent_bytes: int = 256 * 1024 * 1024
    drain_seconds: float = DRAIN_SECONDS
    drain_delay_seconds: float = DRAIN_DELAY_SECONDS
    batching: BatchingSettings = dataclasses.field(default_factory=BatchingSettings)
    # gRPC front (sidecar/grpc): port 0 turns it off; message limit None: max_body_bytes.
    grpc_port: int = GRPC_PORT
    grpc_max_message_bytes: int | None = None
    # Processes that serve REST, beside one that batches (carpool_sidecar.fronts); 1: one
    # process does both.
    front_processes: int = 1

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ConfigError("model-name: must not be empty")
        if not self.model_server.startswith(("unix://", "http://")):
            raise ConfigError(
                f"model-server: must start with unix:// or http://, got {self.model_server!r}"
            )
        _at_least("port", self.port, 0)
        _at_least("max-body-bytes", self.max_body_bytes, 1)
        _at_least("body-timeout-seconds", self.body_timeout_s, 0.001)
        _at_least("max-reading-bytes", self.max_reading_bytes, 1)
        _at_least("max-answer-bytes", self.max_answer_bytes, 1)
        _at_least("max-unsent-bytes", self.max_unsent_bytes, 1)
        _at_least("drain-seconds", self.drain_seconds, 0)
        _at_least("drain-delay-seconds", self.drain_delay_seconds, 0)
        _at_least("grpc-port", self.grpc_port, 0)
        _at_least("front-processes", self.front_processes, 1)
        if self.front_processes > MAX_FRONT_PROCESSES:
            raise ConfigError(
                f"front-processes: must be at most {MAX_FRONT_PROCESSES}, "
                f"got {self.front_processes}"
            )
        if self.front_processes > 1 and self.port == 0:
            raise ConfigError("port: front processes share one port; 0 (any free one) won't do")
        if self.grpc_max_message_bytes is not None:
            _at_least("grpc-max-message-bytes", self.grpc_max_message_bytes, 1)

    @property
    def grpc_message_limit(self) -> int:
        """Largest gRPC message in either direction: by default the REST body limit."""
        return self.grpc_max_message_bytes or self.max_body_bytes
