"""The model server's settings: parsed once in `main`, validated, typed and frozen."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from carpool.contract.pod import DRAIN_SECONDS, MODEL_MAX_BATCH_SIZE
from carpool.model_server.errors import ConfigError

Dtype = Literal["fp32", "fp16", "bf16"]
DTYPES: tuple[Dtype, ...] = ("fp32", "fp16", "bf16")
ENV_PREFIX = "CARPOOL_MODEL_"
DEFAULT_MAX_BATCH_SIZE = MODEL_MAX_BATCH_SIZE
DEFAULT_DRAIN_SECONDS = DRAIN_SECONDS
_DEVICE = re.compile(r"auto|cpu|cuda:\d+")


@dataclass(frozen=True, slots=True)
class Config:
    handler: str
    model_name: str
    model_path: Path | None
    socket: Path | None
    host: str
    port: int | None
    metrics_host: str
    metrics_port: int | None
    device: str
    dtype: Dtype
    max_batch_size: int
    torch_threads: int | None
    warmup_sizes: tuple[int, ...]
    example_shape: tuple[int, ...] | None
    drain_seconds: int


def key_name(option: str) -> str:
    """How errors name an option: its flag and its environment variable."""
    return f"--{option.replace('_', '-')} ({ENV_PREFIX}{option.upper()})"


def parse(raw: Mapping[str, str | None]) -> Config:
    """Build a Config from flag/environment strings (None where unset); raise ConfigError."""

    def text(option: str, default: str | None = None) -> str | None:
        value = raw.get(option)
        return default if value is None or value == "" else value

    def integer(option: str, minimum: int) -> int | None:
        value = text(option)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(key_name(option), value, "must be an integer") from None
        if number < minimum:
            raise ConfigError(key_name(option), value, f"must be at least {minimum}")
        return number

    handler = text("handler")
    if handler is None:
        raise ConfigError(key_name("handler"), None, "is required (e.g. toy, text-embedding)")
    socket, port = text("socket"), integer("port", 0)
    if (socket is None) == (port is None):
        raise ConfigError(
            key_name("socket"), socket, "give exactly one data listener: --socket or --port"
        )
    device = text("device", "auto")
    assert device is not None
    if not _DEVICE.fullmatch(device):
        raise ConfigError(key_name("device"), device, "must be auto, cpu or cuda:N")
    dtype = text("dtype", "fp32")
    if dtype not in DTYPES:
        raise ConfigError(key_name("dtype"), dtype, f"must be one of {', '.join(DTYPES)}")
    max_batch_size = integer("max_batch_size", 1) or DEFAULT_MAX_BATCH_SIZE
    model_path = text("model_path")
    if handler == "torchscript" and model_path is None:
        raise ConfigError(key_name("model_path"), None, "the torchscript handler needs a file")
    return Config(
        handler=handler,
        model_name=text("model_name", handler) or handler,
        model_path=Path(model_path) if model_path else None,
        socket=Path(socket) if socket else None,
        host=text("host", "127.0.0.1") or "127.0.0.1",
        port=port,
        metrics_host=text("metrics_host", "127.0.0.1") or "127.0.0.1",
        metrics_port=integer("metrics_port", 0),
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        torch_threads=integer("torch_threads", 1),
        warmup_sizes=_warmup_sizes(text("warmup_sizes"), max_batch_size),
        example_shape=_example_shape(text("example_shape")),
        drain_seconds=_or_default(integer("drain_seconds", 0), DEFAULT_DRAIN_SECONDS),
    )


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _warmup_sizes(value: str | None, max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to the max batch size when unset (or empty, like every other option);
    "none" turns warm-up off."""
    if value is None:
        sizes = [1]
        while sizes[-1] * 2 <= max_batch_size:
            sizes.append(sizes[-1] * 2)
        if sizes[-1] != max_batch_size:
            sizes.append(max_batch_size)
        return tuple(sizes)
    if value.strip().lower() == "none":
        return ()
    try:
        sizes = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            key_name("warmup_sizes"), value, "must be comma-separated integers"
        ) from None
    if not sizes:
        raise ConfigError(key_name("warmup_sizes"), value, "give batch sizes, or none")
    if any(size < 1 or size > max_batch_size for size in sizes):
        raise ConfigError(key_name("warmup_sizes"), value, f"sizes must lie in 1..{max_batch_size}")
    return tuple(sorted(set(sizes)))


def _example_shape(value: str | None) -> tuple[int, ...] | None:
    """The per-item shape of warm-up inputs, e.g. "3,224,224"; None when unset."""
    if value is None:
        return None
    try:
        shape = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise ConfigError(
            key_name("example_shape"), value, "must be comma-separated integers, e.g. 3,224,224"
        ) from None
    if any(dim < 1 for dim in shape):
        raise ConfigError(key_name("example_shape"), value, "every dimension must be at least 1")
    return shape
