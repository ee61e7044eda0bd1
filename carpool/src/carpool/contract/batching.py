"""The sidecar's batching knobs: file keys, attributes, types, bounds and defaults, once.

`Batching` is the table: one field per knob, whose metadata gives its camelCase key (that of
`spec.batching`, the ConfigMap's batching.json and `status.batching`), its bounds, a summary
and what the CRD says of it. Every entry point derives its knobs from `KNOBS`: the sidecar's
flags and variables and `carpool serve`'s flags (`carpool.knob_flags`), `carpool.batch()`'s
keyword arguments, the operator's defaults, and the files `python -m carpool.contract.generate`
writes (the CRD's `spec.batching`, the chart's `defaults` and their schema, the docs' tables).
A new knob is a new field here, plus what it does.
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
    summary: str  # a few words, for flags' help and the docs' tables
    description: str  # the CRD's, before the sentence on the operator's default
    minimum: int = 0
    maximum: int = 0
    choices: tuple[str, ...] = ()
    # The sidecar takes fractions of a millisecond; spec.batching, like Kubernetes APIs in
    # general, takes whole numbers only, so the operator's values stay integers.
    fractional: bool = False

    @property
    def flag(self) -> str:
        """The sidecar's (and `carpool serve`'s) flag: `--max-batch-size`."""
        return "--" + self.attribute.replace("_", "-")

    @property
    def variable(self) -> str:
        """The sidecar's environment variable: `CARPOOL_MAX_BATCH_SIZE`."""
        return "CARPOOL_" + self.attribute.upper()

    @property
    def kind(self) -> type:
        """The Python type of its values."""
        return str if self.choices else float if self.fractional else int

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


def _knob(key: str, summary: str, description: str, **limits: Any) -> dict[str, Any]:
    """A field's metadata: the Knob it stands for, but for its attribute and default."""
    return {"key": key, "summary": summary, "description": description, **limits}


@dataclass(frozen=True, slots=True)
class Batching:
    """The values of every knob; replaced whole when they change."""

    max_batch_size: int = field(
        default=32,
        metadata=_knob(
            "maxBatchSize",
            "items per batch, at most",
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
            "longest a forming batch waits, from its first item, in ms",
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
            "batches running at once",
            "Batches running in the model server at once.",
            minimum=1,
            maximum=64,
        ),
    )
    max_queue_items: int = field(
        default=1024,
        metadata=_knob(
            "maxQueueItems",
            "queued items before requests are refused (429)",
            "Queued items beyond which requests get 429.",
            minimum=1,
            maximum=1_000_000,
        ),
    )
    max_queue_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata=_knob(
            "maxQueueBytes",
            "queued tensor bytes before requests are refused (429; 413 for one above it)",
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
            "default and longest per-request deadline, in ms",
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
            "padded-length budget per variable-length batch; 0 is none",
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
            "when batches leave: timed, adaptive or fixed",
            "timed ships a batch when the model server can start it, from learned batch "
            "durations, and waits up to maxWaitMs at an idle one only when a fuller batch pays; "
            "adaptive ships a batch as soon as the model server is idle, otherwise when full or "
            "after maxWaitMs; fixed always waits maxWaitMs or a full batch.",
            choices=DISPATCH_MODES,
        ),
    )

    # 0 keeps no objective: nothing is refused for being late, batches are as the knobs say.
    latency_objective_ms: float = field(
        default=0,
        metadata=_knob(
            "latencyObjectiveMs",
            "answer within this many ms, refusing (429) what cannot be; 0 is none",
            "The latency a request should be answered within, from arrival; 0 means none. "
            "With one, batches are no larger than lets a request that waited for the running "
            "batch still finish within it, and a request predicted to finish after it (or "
            "after its own deadline) is refused at once with 429 and a Retry-After, as are "
            "queued lower-priority requests a higher-priority one pushes past theirs. Nothing "
            "is refused before batch durations have been learned.",
            minimum=0,
            maximum=3_600_000,
            fractional=True,
        ),
    )

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000

    @property
    def latency_objective_s(self) -> float:
        return self.latency_objective_ms / 1000

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
# `carpool.batch()`'s defaults where they differ from the sidecar's: one call of the function at
# a time, and adaptive dispatch (a function does not time its batches as a model server does).
IN_PROCESS_DEFAULTS = Batching(max_inflight_batches=1, dispatch="adaptive")
