"""The model server's Prometheus metrics (docs/architecture.md), in a registry of their own."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_SIZE_BUCKETS = tuple(float(2**power) for power in range(11))  # 1, 2, 4, ... 1024
ERROR_KINDS = ("invalid_item", "infer")
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    registry: CollectorRegistry
    model: str
    batch_size: Histogram
    batch_duration: Histogram
    items: Counter
    errors: Counter
    gpu_allocated: Gauge
    gpu_reserved: Gauge
    # This model's series of each, looked up once: `labels()` costs more than the update.
    _batch: tuple[Histogram, Histogram, Counter, Counter, Counter] = field(init=False)

    @classmethod
    def create(cls, model: str, registry: CollectorRegistry | None = None) -> ModelMetrics:
        registry = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=registry,
            model=model,
            batch_size=Histogram(
                "carpool_model_batch_size",
                "Items per batch run by the model.",
                ["model"],
                buckets=BATCH_SIZE_BUCKETS,
                registry=registry,
            ),
            batch_duration=Histogram(
                "carpool_model_batch_duration_seconds",
                "Time to run one batch: preprocess, infer, postprocess and any isolation retries.",
                ["model"],
                buckets=DURATION_BUCKETS,
                registry=registry,
            ),
            items=Counter(
                "carpool_model_items",
                "Items received in batches, valid or not.",
                ["model"],
                registry=registry,
            ),
            errors=Counter(
                "carpool_model_errors",
                "Items answered with an error, by kind: invalid_item (400) or infer (500).",
                ["model", "kind"],
                registry=registry,
            ),
            gpu_allocated=Gauge(
                "carpool_model_gpu_memory_allocated_bytes",
                "GPU memory held by tensors (CUDA only).",
                ["model", "device"],
                registry=registry,
            ),
            gpu_reserved=Gauge(
                "carpool_model_gpu_memory_reserved_bytes",
                "GPU memory reserved by the caching allocator (CUDA only).",
                ["model", "device"],
                registry=registry,
            ),
        )

    def __post_init__(self) -> None:
        # Create every labelled series up front, so a scrape shows zeros before the first batch.
        series = (
            self.batch_size.labels(self.model),
            self.batch_duration.labels(self.model),
            self.items.labels(self.model),
            *(self.errors.labels(self.model, kind) for kind in ERROR_KINDS),
        )
        object.__setattr__(self, "_batch", series)

    def observe_batch(self, size: int, seconds: float, invalid: int, failed: int) -> None:
        batch_size, batch_duration, items, invalid_items, infer_errors = self._batch
        batch_size.observe(size)
        batch_duration.observe(seconds)
        items.inc(size)
        if invalid:  # each inc takes a lock: most batches have nothing to add
            invalid_items.inc(invalid)
        if failed:
            infer_errors.inc(failed)

    def observe_gpu(self, device: torch.device) -> None:
        """Refresh the GPU gauges; a no-op off CUDA, so the gauges exist only on GPU pods."""
        if device.type != "cuda":
            return
        name = str(device)
        self.gpu_allocated.labels(self.model, name).set(torch.cuda.memory_allocated(device))
        self.gpu_reserved.labels(self.model, name).set(torch.cuda.memory_reserved(device))
