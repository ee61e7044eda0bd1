"""The sidecar's Prometheus metrics (docs/architecture.md, "Metrics"), in a registry passed in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from carpool.contract.pod import QUEUE_DRAIN_METRIC, QUEUE_ITEMS_METRIC
from carpool.engine.errors import CLIENT_GONE, LATE_REASONS, QueueFull, SidecarError

BATCH_SIZE_BUCKETS = tuple(float(2**power) for power in range(11))  # 1, 2, 4 ... 1024
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Refusals are meant to take well under the batches they spare the queue.
REFUSAL_BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# padded elements / real elements - 1: 0 means no padding, 1 means as much padding as data.
PADDING_BUCKETS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
# The fronts a request can arrive by: the `protocol` label of the request metrics.
PROTOCOLS = ("rest", "grpc")
# The `protocol` of calls to a `carpool.batch` function, which has no network front.
IN_PROCESS = "inprocess"
# A gauge each of a sidecar's processes holds a share of (its fronts' answers unsent).
UNSENT_ANSWER_BYTES_METRIC = "carpool_unsent_answer_bytes"


@dataclass(slots=True)
class Answer:
    """How one request was answered, as its front learns it; a caller who left is the default."""

    status: int = CLIENT_GONE


class SidecarMetrics:
    """One instance per app; every metric carries the label `model`."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model"], registry=registry, buckets=buckets)

        self.requests = Counter(
            "carpool_requests_total",
            "Inference requests answered, by protocol and HTTP status code (for gRPC: the "
            "status a REST caller would have got).",
            ["model", "protocol", "code"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "carpool_request_duration_seconds",
            "Time from receiving an inference request to answering it.",
            ["model", "protocol"],
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.refusal_duration = Histogram(
            "carpool_refusal_seconds",
            "Time from receiving an inference request to refusing it with 429 (queue full, "
            "or predicted to miss the latency objective or its deadline), by protocol.",
            ["model", "protocol"],
            registry=registry,
            buckets=REFUSAL_BUCKETS,
        )
        self.queue_wait = histogram(
            "carpool_queue_wait_seconds",
            "Time a request waited in the queue before its first items were sent, or before "
            "it left unsent (expired, cancelled, shut down).",
            LATENCY_BUCKETS,
        ).labels(model)
        self.batch_size = histogram(
            "carpool_batch_size", "Items per batch sent to the model server.", BATCH_SIZE_BUCKETS
        ).labels(model)
        self.batches = Counter(
            "carpool_batches_total",
            "Batches sent to the model server, by why they were sent.",
            ["model", "reason"],
            registry=registry,
        )
        self.queue_items = Gauge(
            QUEUE_ITEMS_METRIC, "Items waiting for a batch.", ["model"], registry=registry
        ).labels(model)
        self.inflight_batches = Gauge(
            "carpool_inflight_batches",
            "Batches sent to the model server and not yet answered.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.unsent_answer_bytes = Gauge(
            UNSENT_ANSWER_BYTES_METRIC,
            "Bytes of answers built and not yet sent (--max-unsent-bytes bounds them).",
            ["model"],
            registry=registry,
        ).labels(model)
        self.rejected = Counter(
            "carpool_rejected_total",
            "Requests refused or dropped before reaching the model, by reason.",
            ["model", "reason"],
            registry=registry,
        )
        self.padding_ratio = histogram(
            "carpool_batch_padding_ratio",
            "Padding of variable-length batches: padded elements / real elements - 1.",
            PADDING_BUCKETS,
        ).labels(model)
        self.model_duration = histogram(
            "carpool_model_duration_seconds",
            "Round trip of one batch to the model server.",
            LATENCY_BUCKETS,
        ).labels(model)
        # Timed dispatch's model of the model server: a batch of b items takes
        # fixed + item * b seconds there, and the hop there and back adds the hop.
        self.model_fixed = Gauge(
            "carpool_model_batch_fixed_seconds",
            "Learned time of a batch at the model server that does not grow with its size.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.model_item = Gauge(
            "carpool_model_batch_item_seconds",
            "Learned time each item adds to a batch at the model server.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.model_hop = Gauge(
            "carpool_model_hop_seconds",
            "Learned round trip of a batch to the model server beyond its time there.",
            ["model"],
            registry=registry,
        ).labels(model)
        # The latency objective (latencyObjectiveMs) and how it is kept.
        self.objective = Gauge(
            "carpool_latency_objective_seconds",
            "The latency objective requests should be answered within; 0: none.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.within_objective = Counter(
            "carpool_requests_within_objective_total",
            "Requests answered successfully within the latency objective (goodput, against "
            "carpool_requests_total); none counted without an objective.",
            ["model"],
            registry=registry,
        ).labels(model)
        self.queue_drain = Gauge(
            QUEUE_DRAIN_METRIC,
            "Predicted time for the model server to run the batches in flight and every "
            "queued item, from the learned batch durations; 0 until they are learned.",
            ["model"],
            registry=registry,
        ).labels(model)
        self._objective_s = 0.0
        self._model = model
        # Create every labelled child up front so dashboards see zeros, not gaps.
        # batch_sent runs once per batch and labels() is a locked lookup: kept by reason.
        self._batches_by_reason = {
            reason: self.batches.labels(model, reason)
            for reason in ("full", "timeout", "idle", "model_ready", "drain")
        }
        for reason in (
            "queue_full", "deadline", "too_large", "bad_request", "body_timeout", *LATE_REASONS
        ):  # fmt: skip
            self.rejected.labels(model, reason)
        for protocol in PROTOCOLS:
            self.request_duration.labels(model, protocol)
            self.refusal_duration.labels(model, protocol)
        # answered() runs once per request and labels() is a locked lookup with string
        # keys: its children are kept here by (protocol, code).
        self._answers: dict[tuple[str, int], tuple[Counter, Histogram, Histogram | None]] = {}

    def batch_sent(self, reason: str, size: int) -> None:
        self._batches_by_reason[reason].inc()
        self.batch_size.observe(size)

    def read_engine(
        self,
        inflight: Callable[[], float],
        fixed_s: Callable[[], float],
        item_s: Callable[[], float],
        hop_s: Callable[[], float],
    ) -> None:
        """Gauges the engine changes with every batch, read when scraped: setting one takes
        a lock, and at one caller every batch is a request."""
        self.inflight_batches.set_function(inflight)
        self.model_fixed.set_function(fixed_s)
        self.model_item.set_function(item_s)
        self.model_hop.set_function(hop_s)

    def keep_objective(self, objective_s: float) -> None:
        """Count answers within `objective_s` from now on (0: none)."""
        self._objective_s = objective_s
        self.objective.set(objective_s)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self._model, reason).inc()

    def answered(self, code: int, seconds: float, protocol: str) -> None:
        children = self._answers.get((protocol, code))
        if children is None:
            refused = code == QueueFull.status
            children = (
                self.requests.labels(self._model, protocol, str(code)),
                self.request_duration.labels(self._model, protocol),
                self.refusal_duration.labels(self._model, protocol) if refused else None,
            )
            self._answers[protocol, code] = children
        requests, duration, refusal = children
        requests.inc()
        duration.observe(seconds)
        if refusal is not None:
            refusal.observe(seconds)
        if self._objective_s and code < 300 and seconds <= self._objective_s:
            self.within_objective.inc()

    def answering(self, protocol: str) -> Answering:
        """Count one request once, however it ends: the one place every front (REST, gRPC,
        `carpool.batch`) counts its answers.

        The front sets `status` when it answers; a SidecarError gives its own status (and
        its refusal reason), another exception 500 unless the front set one, and a request
        whose front never answered (cancelled: the caller left) counts as CLIENT_GONE. Its
        time runs from entering the block, by `time.monotonic`: not by the loop's clock,
        which on uvloop counts whole milliseconds, and many an answer takes less.
        """
        return Answering(self, protocol)


class Answering:
    """`SidecarMetrics.answering`'s context: a class rather than a generator, as it runs
    once per request."""

    __slots__ = ("_answer", "_begun", "_metrics", "_protocol")

    def __init__(self, metrics: SidecarMetrics, protocol: str) -> None:
        self._metrics = metrics
        self._protocol = protocol
        self._begun = 0.0
        self._answer = Answer()

    def __enter__(self) -> Answer:
        self._begun = time.monotonic()
        return self._answer

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        answer = self._answer
        if isinstance(error, SidecarError):
            answer.status = error.status
            if error.rejected_reason is not None:
                self._metrics.reject(error.rejected_reason)
        elif isinstance(error, Exception) and answer.status == CLIENT_GONE:
            answer.status = 500  # unless the front said what it answers
        self._metrics.answered(answer.status, time.monotonic() - self._begun, self._protocol)
