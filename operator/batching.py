"""The sidecar's batching settings: their keys, bounds and built-in defaults.

One table serves three readers: `spec.parse` (a BatchedModel's `spec.batching`), `defaults`
(the operator's own defaults, from flags or CARPOOL_DEFAULT_* variables) and the tests that
hold the bounds to the CRD's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DISPATCH_MODES = ("adaptive", "fixed")


@dataclass(frozen=True)
class Knob:
    """One integer setting: its spec.batching / batching.json key, attribute and bounds."""

    key: str
    attribute: str
    minimum: int
    maximum: int


# The same bounds as spec.batching in crds/batchedmodels.carpool.dev.yaml (a test checks).
KNOBS = (
    Knob("maxBatchSize", "max_batch_size", 1, 1024),
    Knob("maxWaitMs", "max_wait_ms", 0, 10_000),
    Knob("maxInflightBatches", "max_inflight_batches", 1, 64),
    Knob("maxQueueItems", "max_queue_items", 1, 1_000_000),
    Knob("timeoutMs", "timeout_ms", 1, 3_600_000),
    Knob("maxBatchTokens", "max_batch_tokens", 0, 100_000_000),
)


@dataclass(frozen=True)
class Batching:
    max_batch_size: int = 32
    max_wait_ms: int = 5
    max_inflight_batches: int = 2
    max_queue_items: int = 1024
    timeout_ms: int = 30000
    dispatch: str = "adaptive"
    max_batch_tokens: int = 0

    def overlay(self, given: Mapping[str, Any]) -> Batching:
        """These settings with those `given` (by batching.json key) put over them."""
        return Batching(
            max_batch_size=int(given.get("maxBatchSize", self.max_batch_size)),
            max_wait_ms=int(given.get("maxWaitMs", self.max_wait_ms)),
            max_inflight_batches=int(given.get("maxInflightBatches", self.max_inflight_batches)),
            max_queue_items=int(given.get("maxQueueItems", self.max_queue_items)),
            timeout_ms=int(given.get("timeoutMs", self.timeout_ms)),
            dispatch=str(given.get("dispatch", self.dispatch)),
            max_batch_tokens=int(given.get("maxBatchTokens", self.max_batch_tokens)),
        )

    def as_file(self) -> dict[str, int | str]:
        """The keys of docs/architecture.md's batching.json (also `status.batching`)."""
        return {
            "maxBatchSize": self.max_batch_size,
            "maxWaitMs": self.max_wait_ms,
            "maxInflightBatches": self.max_inflight_batches,
            "maxQueueItems": self.max_queue_items,
            "timeoutMs": self.timeout_ms,
            "dispatch": self.dispatch,
            "maxBatchTokens": self.max_batch_tokens,
        }
