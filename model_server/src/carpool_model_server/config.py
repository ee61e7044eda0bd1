"""The model server's settings: parsed once in `main`, validated, typed and frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from carpool.contract.handlers import NEEDS_MODEL_PATH
from carpool.contract.pod import DRAIN_SECONDS, MODEL_MAX_BATCH_SIZE
from carpool_model_server.errors import ConfigError

Dtype = Literal["fp32", "fp16", "bf16"]
DTYPES: tuple[Dtype, ...] = ("fp32", "fp16", "bf16")
ENV_PREFIX = "CARPOOL_MODEL_"
DEFAULT_MAX_BATCH_SIZE = MODEL_MAX_BATCH_SIZE
DEFAULT_DRAIN_SECONDS = DRAIN_SECONDS
# Warm-up stops once it has run this long; the shapes it did not reach run cold.
DEFAULT_WARMUP_SECONDS = 300
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
    # None: every size on a GPU, powers of two on a CPU (`warmup.default_sizes`).
    warmup_sizes: tuple[int, ...] | None
    warmup_seconds: int
    example_shape: tuple[int, ...] | None
    drain_seconds: int
    pipeline: bool
    # The handler's own settings (`--handler-options key=value,...`), in the order given.
    handler_options: tuple[tuple[str, str], ...] = ()


def key_name(option: str) -> str:
    """How errors name an option: its flag and its environment variable."""
    return f"--{option.replace('_', '-')} ({ENV_PREFIX}{option.upper()})"


class Options(TypedDict, total=False):
    """The command line's values, converted by click; None (or absent) where unset."""

    handler: str | None
    model_name: str | None
    model_path: Path | None
    socket: Path | None
    host: str | None
    port: int | None
    metrics_host: str | None
    metrics_port: int | None
    device: str | None
    dtype: Dtype | None
    max_batch_size: int | None
    torch_threads: int | None
    warmup_sizes: tuple[int, ...] | None
    warmup_seconds: int | None
    example_shape: tuple[int, ...] | None
    drain_seconds: int | None
    pipeline: bool | None
    handler_options: tuple[tuple[str, str], ...] | None


def parse(options: Options) -> Config:
    """Fill in defaults and check what no single option can; raise ConfigError."""
    handler = options.get("handler")
    if not handler:
        raise ConfigError(key_name("handler"), None, "is required (e.g. toy, text-embedding)")
    socket, port = options.get("socket"), options.get("port")
    if (socket is None) == (port is None):
        raise ConfigError(
            key_name("socket"), socket, "give exactly one data listener: --socket or --port"
        )
    device = options.get("device") or "auto"
    if not _DEVICE.fullmatch(device):
        raise ConfigError(key_name("device"), device, "must be auto, cpu or cuda:N")
    max_batch_size = options.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE
    model_path = options.get("model_path")
    if handler in NEEDS_MODEL_PATH and model_path is None:
        raise ConfigError(key_name("model_path"), None, f"the {handler} handler needs the model")
    return Config(
        handler=handler,
        model_name=options.get("model_name") or handler,
        model_path=model_path,
        socket=socket,
        host=options.get("host") or "127.0.0.1",
        port=port,
        metrics_host=options.get("metrics_host") or "127.0.0.1",
        metrics_port=options.get("metrics_port"),
        device=device,
        dtype=options.get("dtype") or "fp32",
        max_batch_size=max_batch_size,
        torch_threads=options.get("torch_threads"),
        warmup_sizes=_warmup_sizes(options.get("warmup_sizes"), max_batch_size),
        warmup_seconds=_given(options.get("warmup_seconds"), DEFAULT_WARMUP_SECONDS),
        example_shape=options.get("example_shape"),
        drain_seconds=_given(options.get("drain_seconds"), DEFAULT_DRAIN_SECONDS),
        pipeline=options.get("pipeline") is not False,
        handler_options=options.get("handler_options") or (),
    )


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _warmup_sizes(sizes: tuple[int, ...] | None, max_batch_size: int) -> tuple[int, ...] | None:
    """None when unset (the device decides); () (from "none") turns warm-up off."""
    if sizes is None:
        return None
    if any(size > max_batch_size for size in sizes):
        shown = ",".join(map(str, sizes))
        raise ConfigError(key_name("warmup_sizes"), shown, f"sizes must lie in 1..{max_batch_size}")
    return tuple(sorted(set(sizes)))
