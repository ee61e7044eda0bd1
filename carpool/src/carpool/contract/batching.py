"""The sidecar's batching knobs: file keys, attributes, types, bounds and defaults, once.

`Batching` is the table: one field per knob, whose metadata gives its camelCase key (that of
`spec.batching`, the ConfigMap's batching.json and `status.batching`), its bounds and what the
CRD says of it. The sidecar checks its settings against `KNOBS`, the operator checks its
defaults against them, and `carpool.contract.crd` writes the CRD's `spec.batching` from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self, get_args

Dispatch = Literal["timed", "adaptive", "fixed"]
DISPATCH_MODES: tuple[Dispatch, ...] = get_args(Dispatch)


@dataclass(frozen=True, slots=True)
class Knob:
    """One batching setting as the contract states it."""

    key: str  # camelCase, as in spec.batching and batching.json
    attribute: str  # Batching's field; the sidecar's flag and variable derive from it
    default: float | str
    description: str  # the CRD's, before the sentence on the operator's default
    minimum: int = 0
    maximum: int = 0
    choices: tuple[str, ...] = ()
    # The sidecar takes fractions of a millisecond; spec.batching, like Kubernetes APIs in
    # general, takes whole numbers only, so the operator's values stay integers.
    fractional: bool = False

    def problem(self, value: object) -> str | None:
        """Why `value` is not a setting of this knob; None when it is one."""
        if self.choices:
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}"
        kind = "a number" if self.fractional else "an integer"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {kind} from {self.minimum} to {self.maximum}"
        if (self.fractional or isinstance(value, int)) and self.minimum <= value <= self.maximum:
            return None
        return f"must be {kind} from {self.minimum} to {self.maximum}"


def _knob(key: str, description: str, **limits: Any) -> dict[str, Any]:
    """A field's metadata: the Knob it stands for, but for its attribute and default."""
    return {"key": key, "description": description, **limits}


@dataclass(frozen=True, slots=True)
class Batching:
    """The values of every knob; replaced whole when they change."""

    max_batch_size: int = field(
        default=32,
        metadata=_knob(
            "maxBatchSize",
            "The largest batch shipped to the model server, held to spec.model.maxBatchSize "
            "(a Warning event BatchSizeClamped says when it is).",
            minimum=1,
            maximum=1024,
        ),
    )
    max_wait_ms: float = field(
        default=5,
        metadata=_knob(
            "maxWaitMs",
            "How long the first request of a batch waits for company.",
            minimum=0,
            maximum=10_000,
            fractional=True,
        ),
    )
    max_inflight_batches: int = field(
        default=2,
        metadata=_knob(
            "maxInflightBatches",
            "Batches running in the model server at once.",
            minimum=1,
            maximum=64,
        ),
    )
    max_queue_items: int = field(
        default=1024,
        metadata=_knob(
            "maxQueueItems",
            "Queued items beyond which requests get 429.",
            minimum=1,
            maximum=1_000_000,
        ),
    )
    max_queue_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata=_knob(
            "maxQueueBytes",
            "Bytes of queued tensor data beyond which requests get 429; a request larger "
            "than this alone gets 413.",
            minimum=1,
            maximum=64 * 1024**3,
        ),
    )
    timeout_ms: float = field(
        default=30_000,
        metadata=_knob(
            "timeoutMs",
            "A request's deadline from arrival to answer.",
            minimum=1,
            maximum=3_600_000,
            fractional=True,
        ),
    )
    # Sum of padded lengths allowed in one batch of variable-length items; 0 means no budget.
    max_batch_tokens: int = field(
        default=0,
        metadata=_knob(
            "maxBatchTokens",
            "Budget for variable-length inputs: the sum of padded lengths in one batch (text is "
            "measured in bytes); 0 means no budget.",
            minimum=0,
            maximum=100_000_000,
        ),
    )
    dispatch: Dispatch = field(
        default="timed",
        metadata=_knob(
            "dispatch",
            "timed ships a batch when the model server can start it, from learned batch "
            "durations, and waits up to maxWaitMs at an idle one only when a fuller batch pays; "
            "adaptive ships a batch as soon as the model server is idle, otherwise when full or "
            "after maxWaitMs; fixed always waits maxWaitMs or a full batch.",
            choices=DISPATCH_MODES,
        ),
    )

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000

    def overlay(self, given: Mapping[str, Any]) -> Self:
        """These settings with those `given` (by file key) put over them; KeyError for a key
        that is no knob's."""
        return dataclasses.replace(
            self, **{KNOB_BY_KEY[key].attribute: value for key, value in given.items()}
        )

    def as_file(self) -> dict[str, float | str]:
        """The batching.json document (also `status.batching`), by file key."""
        return {knob.key: getattr(self, knob.attribute) for knob in KNOBS}


_BUILT_IN = Batching()
KNOBS: tuple[Knob, ...] = tuple(
    Knob(attribute=each.name, default=getattr(_BUILT_IN, each.name), **each.metadata)
    for each in dataclasses.fields(Batching)
)
KNOB_BY_KEY: Mapping[str, Knob] = {knob.key: knob for knob in KNOBS}
