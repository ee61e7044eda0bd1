"""Which model errors leave the device unusable for the rest of the process.

A device-side assert or an illegal memory access poisons the CUDA context: every later
kernel launch fails too, whatever the batch. Retrying smaller batches cannot help, so such
an error must not be bisected. Recent torch raises `torch.AcceleratorError` for these;
older releases raise a RuntimeError whose message starts "CUDA error". Running out of memory
(`torch.OutOfMemoryError`, "CUDA out of memory") is not among them: a smaller batch can fit.
"""

from __future__ import annotations

import torch

# torch.AcceleratorError appeared in torch 2.8; pyproject allows older releases.
_ACCELERATOR_ERROR: type[Exception] | None = getattr(torch, "AcceleratorError", None)


def is_fatal(error: BaseException) -> bool:
    if _ACCELERATOR_ERROR is not None and isinstance(error, _ACCELERATOR_ERROR):
        return True
    return isinstance(error, RuntimeError) and "CUDA error" in str(error)
