"""`carpool model-server`: parse the settings, listen at once, load in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from aiohttp import web

from carpool.model_server import config as config_module
from carpool.model_server.config import Config
from carpool.model_server.errors import ConfigError

if TYPE_CHECKING:
    from carpool.model_server.service import ModelService

log = logging.getLogger("carpool.model_server")
# How long SIGTERM waits for batches in flight before closing their connections.
SHUTDOWN_TIMEOUT_S = 30.0
# After SIGTERM the server keeps answering until no batch has come for this long: in a pod the
# sidecar gets the same SIGTERM and drains its queue through us, so we must outlive it.
DRAIN_IDLE_S = 1.0

OPTIONS: tuple[tuple[str, str], ...] = (
    ("handler", "toy | torchscript | text-embedding | text-generation | module:Class"),
    ("model_name", "name in metrics and metadata (default: the handler name)"),
    ("model_path", "model file (torchscript) or folder (text-generation)"),
    ("socket", "Unix socket path of the data listener"),
    ("host", "TCP data listener address (default 127.0.0.1), with --port"),
    ("port", "TCP data listener port, instead of --socket"),
    ("metrics_host", "address of the probe listener (default 127.0.0.1; 0.0.0.0 in pods)"),
    ("metrics_port", "port of the probe listener: healthz, readyz, metadata, metrics only"),
    ("device", "auto | cpu | cuda:N (default auto: CUDA when present)"),
    ("dtype", "fp32 | fp16 | bf16 (default fp32; fp16 needs CUDA)"),
    (
        "max_batch_size",
        f"largest batch the model runs (default {config_module.DEFAULT_MAX_BATCH_SIZE})",
    ),
    ("torch_threads", "torch intra-op threads; dominates CPU throughput"),
    ("warmup_sizes", "comma-separated batch sizes run before ready, or none (default 1,2,4..max)"),
    (
        "example_shape",
        "per-item input shape, e.g. 3,224,224: warm up with zeros of it "
        "(for handlers without an example item, such as torchscript)",
    ),
    (
        "drain_seconds",
        "after SIGTERM, keep serving while batches still arrive, at most this long "
        f"(default {config_module.DEFAULT_DRAIN_SECONDS})",
    ),
)


def _with_options(function: Callable[..., None]) -> Callable[..., None]:
    # Every option is read as text and validated in one place, config.parse.
    for name, help_text in reversed(OPTIONS):
        flag = "--" + name.replace("_", "-")
        envvar = config_module.ENV_PREFIX + name.upper()
        function = click.option(flag, name, envvar=envvar, help=f"{help_text} [{envvar}]")(function)
    return function


@click.command("model-server")
@_with_options
def command(**options: str | None) -> None:
    """Serve a torch model: POST /batch runs a whole batch in one forward pass."""
    try:
        config = config_module.parse(options)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        code = asyncio.run(serve(config))
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    sys.exit(code)


async def serve(config: Config) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or a failed load (exit 1)."""
    # Imported here so `--help` and config errors do not wait for torch.
    from carpool.model_server.app import data_app, probe_app
    from carpool.model_server.build import build_service

    service = build_service(config)
    if config.socket is not None:
        _remove_stale_socket(config.socket)
        runners = [await _listen(data_app(service), config.socket)]
    else:
        assert config.port is not None
        runners = [await _listen(data_app(service), (config.host, config.port))]
    if config.metrics_port is not None:
        probe_address = (config.metrics_host, config.metrics_port)
        runners.append(await _listen(probe_app(service), probe_address))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loading = asyncio.create_task(service.start(config.torch_threads, config.warmup_sizes))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loading.done() and loading.exception() is not None:
        log.error("model failed to load", exc_info=loading.exception())
        code = 1
    elif not stop.is_set():
        log.info("ready: %s", config.model_name)
        await stopping
    if code == 0:
        await _drain(service, config.drain_seconds)
    log.info("shutting down")
    stopping.cancel()
    for runner in runners:
        await runner.cleanup()  # waits for requests in flight, up to SHUTDOWN_TIMEOUT_S
    # Joins the worker thread: the batch (or load) in progress finishes first.
    await asyncio.to_thread(service.runner.close)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await loading
    return code


async def _drain(service: ModelService, limit_s: float) -> None:
    """Serve until no batch has come for DRAIN_IDLE_S, or until `limit_s` has passed."""
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        idle = service.idle_for()
        if idle >= DRAIN_IDLE_S:
            return
        # Sleep until the idle window could close; a batch arriving meanwhile restarts it.
        await asyncio.sleep(min(DRAIN_IDLE_S - idle, left))


async def _listen(app: web.Application, address: Path | tuple[str, int]) -> web.AppRunner:
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S, access_log=None
    )
    await runner.setup()
    site: web.BaseSite
    if isinstance(address, Path):
        site = web.UnixSite(runner, str(address))
    else:
        site = web.TCPSite(runner, *address)
    await site.start()
    log.info("listening on %s", site.name)
    return runner


def _remove_stale_socket(path: Path) -> None:
    """A socket file left by a killed server would make bind fail; anything else is refused."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(config_module.key_name("socket"), str(path), "exists and is no socket")
    path.unlink()
