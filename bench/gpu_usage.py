"""How busy the GPU was during a span: NVML's utilisation, sampled on a thread of its own.

Through nvidia-ml-py (`import pynvml`) when it is installed and finds the device; without it,
without a driver, or for a CPU run, nothing is sampled and the figure is absent (None), never
a made-up zero. NVML's figure is the share of the last sample period (1/6 s to 1 s, by
device) in which a kernel ran; sampled every `interval_s`, its mean over a cell says how much
of the accelerator the variant kept busy.
"""

from __future__ import annotations

import importlib
import statistics
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class GpuUsage:
    mean_percent: float
    max_percent: float
    samples: int


def gpu_index(device: str) -> int | None:
    """The GPU a `--device` names (`auto`: the first, if NVML finds one); None for the CPU."""
    if device == "cpu":
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def load_nvml() -> ModuleType | None:
    """pynvml, initialised; None where it is not installed or finds no driver."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError without a driver: no figure, no failure
        return None
    return nvml


class GpuSampler:
    """`start()` ... `stop()`: the GPU's utilisation in between; None when unmeasured."""

    def __init__(
        self, nvml: ModuleType | None, index: int | None, interval_s: float = INTERVAL_S
    ) -> None:
        self._handle: Any = None
        if nvml is not None and index is not None:
            try:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:  # an index NVML does not know: unmeasured
                self._handle = None
        self._nvml = nvml
        self._interval_s = interval_s
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_device(cls, device: str) -> GpuSampler:
        """A sampler of the GPU `device` names (`--device`); one that samples nothing for the
        CPU or where NVML is missing."""
        index = gpu_index(device)
        return cls(None if index is None else load_nvml(), index)

    @property
    def available(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        if not self.available:
            return
        self._samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._sample, name="gpu-usage", daemon=True)
        self._thread.start()

    def stop(self) -> GpuUsage | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        if not self._samples:
            return None
        samples = self._samples
        return GpuUsage(statistics.fmean(samples), max(samples), len(samples))

    def _sample(self) -> None:
        assert self._nvml is not None
        while not self._stop.wait(self._interval_s):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            except Exception:  # a sample NVML could not take is left out, not counted as 0
                continue
            self._samples.append(float(rates.gpu))
