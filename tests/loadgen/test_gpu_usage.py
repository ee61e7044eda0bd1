"""bench/gpu_usage.py: the GPU's utilisation from NVML when it is there, absent otherwise."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_usage", BENCH_DIR / "gpu_usage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpu_usage = _load()


class FakeNvml(ModuleType):
    """pynvml's calls the sampler makes, on a device whose utilisation follows `readings`
    (None: NVML fails to read that sample)."""

    def __init__(self, readings: list[float | None], devices: int = 1) -> None:
        super().__init__("pynvml")
        self.readings = readings
        self.devices = devices
        self.read = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= self.devices:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        reading = self.readings[min(self.read, len(self.readings) - 1)]
        self.read += 1
        if reading is None:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return SimpleNamespace(gpu=reading, memory=0)


def _sample_until(sampler: object, nvml: FakeNvml, reads: int) -> object:
    sampler.start()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while nvml.read < reads and time.monotonic() < deadline:
        time.sleep(0.01)
    return sampler.stop()  # type: ignore[attr-defined]


def test_a_gpu_reports_its_mean_utilisation_over_the_span() -> None:
    nvml = FakeNvml([20.0, None, 40.0, 60.0])
    sampler = gpu_usage.GpuSampler(nvml, 0, interval_s=0.001)
    usage = _sample_until(sampler, nvml, 4)
    # A sample NVML could not read is left out, not counted as an idle GPU; after the
    # readings run out the device stays at 60 %.
    assert usage.max_percent == 60.0
    assert 40.0 <= usage.mean_percent < 60.0
    assert usage.samples == nvml.read - 1
    # A second span starts afresh.
    nvml.readings, nvml.read = [10.0], 0
    again = _sample_until(sampler, nvml, 2)
    assert again.mean_percent == again.max_percent == 10.0


def test_no_nvml_no_gpu_or_the_cpu_leave_the_figure_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for sampler in (
        gpu_usage.GpuSampler(None, 0),
        gpu_usage.GpuSampler(FakeNvml([50.0]), 1),  # an index the driver does not know
        gpu_usage.GpuSampler(FakeNvml([50.0]), None),  # the CPU
    ):
        assert not sampler.available
        sampler.start()
        assert sampler.stop() is None
    # nvidia-ml-py not installed (or no driver): nothing is sampled, nothing fails.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu_usage.load_nvml() is None
    assert not gpu_usage.GpuSampler.for_device("cuda:0").available


def test_a_device_names_its_gpu() -> None:
    assert gpu_usage.gpu_index("cpu") is None
    assert gpu_usage.gpu_index("auto") == 0
    assert gpu_usage.gpu_index("cuda:3") == 3
