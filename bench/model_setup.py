"""The handler every bench variant builds alike: the model server's own settings checks
(`--device`, `--dtype`, handler options), so a variant refuses what carpool refuses (fp16
on a CPU) rather than measuring something else."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from carpool_model_server.config import parse
from carpool_model_server.device import resolve_device, resolve_dtype
from carpool_model_server.handler import AnyHandler, HandlerSettings, load_handler_class


def build_handler(
    handler: str,
    device: str,
    dtype: str,
    max_batch_size: int,
    options: Iterable[tuple[str, str]] = (),
    model_path: Path | None = None,
) -> tuple[AnyHandler, torch.device]:
    """The handler, built (not loaded) as the model server builds it, and its device.

    Raises ConfigError for a setting the model server would refuse.
    """
    config = parse(
        {
            "handler": handler,
            "socket": Path("unused"),
            "device": device,
            "dtype": dtype,
            "max_batch_size": max_batch_size,
            "handler_options": tuple(options),
            "model_path": model_path,
        }
    )
    resolved = resolve_device(config)
    settings = HandlerSettings(
        config.model_path,
        resolve_dtype(config, resolved),
        config.max_batch_size,
        dict(config.handler_options),
    )
    return load_handler_class(config.handler)(settings), resolved
