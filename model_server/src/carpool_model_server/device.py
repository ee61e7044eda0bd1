"""Turns the --device and --dtype settings into torch objects, refusing what cannot run."""

from __future__ import annotations

import torch

from carpool_model_server.config import Config, key_name
from carpool_model_server.errors import ConfigError

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(config: Config) -> torch.device:
    """`auto` is the first CUDA device when there is one, else the CPU."""
    if config.device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(config.device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device.index is not None and device.index >= count:
            raise ConfigError(key_name("device"), config.device, f"{count} CUDA device(s) here")
    return device


class GpuMissing(RuntimeError):
    """A GPU is required and torch sees none: serving on the CPU instead would be wrong."""


def require_cuda(device: str) -> None:
    """Refuse a start without a CUDA device when the pod asked for a GPU (--require-gpu).

    Otherwise `auto` quietly serves on the CPU while the pod holds a GPU, and `cuda:N` fails
    only after the model has been loaded.
    """
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cpu":
        raise GpuMissing("a GPU is required (--require-gpu) but --device is cpu")
    if count == 0:
        if torch.version.cuda is None:
            why = f"torch {torch.__version__} is a CPU-only build: use the CUDA image"
        else:
            why = (
                f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no device: check "
                "the nvidia.com/gpu limit, the NVIDIA device plugin and runtimeClassName"
            )
        raise GpuMissing(f"a GPU is required (--require-gpu) but no CUDA device is visible; {why}")


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a host tensor to `device`; to a GPU from pinned memory without blocking, so that
    preprocess on its own thread queues the copy and returns (the worker's kernels run on the
    same stream, after it)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def resolve_dtype(config: Config, device: torch.device) -> torch.dtype:
    """fp16 needs a GPU: CPU kernels for it are slow or missing. bf16 runs on both."""
    if config.dtype == "fp16" and device.type != "cuda":
        raise ConfigError(
            key_name("dtype"),
            config.dtype,
            f"fp16 needs a CUDA device, not {device}; use fp32 or bf16 on CPU",
        )
    return TORCH_DTYPES[config.dtype]
