"""The GPU gauges: present on a CUDA device, absent on the CPU, whatever the machine has."""

from __future__ import annotations

import pytest
import torch

from carpool_model_server.metrics import ModelMetrics


def gpu_samples(metrics: ModelMetrics) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels["device"]): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.startswith("carpool_model_gpu")
    }


def test_a_cuda_device_gets_its_memory_gauges(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA path without a GPU: torch's memory counters answer for a device it has not.
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3 << 20)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 8 << 20)
    metrics = ModelMetrics.create("toy")
    metrics.observe_gpu(torch.device("cuda:0"))
    assert gpu_samples(metrics) == {
        ("carpool_model_gpu_memory_allocated_bytes", "cuda:0"): 3 << 20,
        ("carpool_model_gpu_memory_reserved_bytes", "cuda:0"): 8 << 20,
    }


def test_the_cpu_has_no_gpu_gauges() -> None:
    metrics = ModelMetrics.create("toy")
    metrics.observe_gpu(torch.device("cpu"))
    assert gpu_samples(metrics) == {}
