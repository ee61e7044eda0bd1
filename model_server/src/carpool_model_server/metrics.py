"""The model server's Prometheus metrics (docs/architecture.md), in a registry of their own."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from prometheus_client import CollectorRegistry, Gauge

from carpool_model_server.batch_tally import BatchTally


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    registry: CollectorRegistry
    model: str
    # Batch sizes and durations, items and errors (`batch_tally`): zeros before the first batch.
    batches: BatchTally
    gpu_allocated: Gauge
    gpu_reserved: Gauge

    @classmethod
    def create(cls, model: str, registry: CollectorRegistry | None = None) -> ModelMetrics:
        registry = registry if registry is not None else CollectorRegistry()
        batches = BatchTally(model)
        registry.register(batches)
        return cls(
            registry=registry,
            model=model,
            batches=batches,
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

    def observe_batch(self, size: int, seconds: float, invalid: int, failed: int) -> None:
        self.batches.observe_batch(size, seconds, invalid, failed)

    def observe_gpu(self, device: torch.device) -> None:
        """Refresh the GPU gauges; a no-op off CUDA, so the gauges exist only on GPU pods."""
        if device.type != "cuda":
            return
        name = str(device)
        self.gpu_allocated.labels(self.model, name).set(torch.cuda.memory_allocated(device))
        self.gpu_reserved.labels(self.model, name).set(torch.cuda.memory_reserved(device))
