"""`carpool model-server`: parse the settings, listen at once, load in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from aiohttp import web

from carpool import event_loop, heap
from carpool.comma_list import CommaList, KeyValue
from carpool.contract import frames
from carpool.contract.handlers import BUILTIN_HANDLERS
from carpool.contract.pod import LOAD_FAILED
from carpool_model_server import config as config_module
from carpool_model_server.config import Config
from carpool_model_server.errors import ConfigError
from carpool_model_server.termination import DEFAULT_PATH, write_termination_message

if TYPE_CHECKING:
    from carpool_model_server.service import ModelService

log = logging.getLogger("carpool_model_server")
# How long SIGTERM waits for batches in flight before closing their connections.
SHUTDOWN_TIMEOUT_S = 30.0
# After SIGTERM the server keeps answering until no batch has come for this long: in a pod the
# sidecar gets the same SIGTERM and drains its queue through us, so we must outlive it.
DRAIN_IDLE_S = 1.0

PATH = click.Path(path_type=Path)
AT_LEAST_0, AT_LEAST_1 = click.IntRange(min=0), click.IntRange(min=1)
OPTIONS: tuple[tuple[str, click.ParamType[Any], str], ...] = (
    (
        "handler",
        click.STRING,
        " | ".join([*BUILTIN_HANDLERS, "module:Class"]),
    ),
    (
        "handler_options",
        CommaList(KeyValue()),
        "the handler's own settings, e.g. preset=fast,jitter=0.1 for stand-in",
    ),
    ("model_name", click.STRING, "name in metrics and metadata (default: the handler name)"),
    (
        "model_path",
        PATH,
        "model file (torchscript, torch-export) or folder (text-embedding, text-classification, "
        "image-classification, text-generation)",
    ),
    ("socket", PATH, "Unix socket path of the data listener"),
    ("host", click.STRING, "TCP data listener address (default 127.0.0.1), with --port"),
    ("port", AT_LEAST_0, "TCP data listener port, instead of --socket"),
    (
        "metrics_host",
        click.STRING,
        "address of the probe listener (default 127.0.0.1; 0.0.0.0 in pods)",
    ),
    (
        "metrics_port",
        AT_LEAST_0,
        "port of the probe listener: healthz, readyz, metadata, metrics only",
    ),
    ("device", click.STRING, "auto | cpu | cuda:N (default auto: CUDA when present)"),
    ("dtype", click.Choice(config_module.DTYPES), "default fp32; fp16 needs CUDA"),
    (
        "max_batch_size",
        AT_LEAST_1,
        f"largest batch the model runs (default {config_module.DEFAULT_MAX_BATCH_SIZE})",
    ),
    ("torch_threads", AT_LEAST_1, "torch intra-op threads; dominates CPU throughput"),
    (
        "warmup_sizes",
        CommaList(AT_LEAST_1, none_word="none"),
        "comma-separated batch sizes run before ready, or none (default: every size "
        "from 1 to max on a GPU, 1,2,4..max on a CPU)",
    ),
    (
        "warmup_seconds",
        AT_LEAST_0,
        "warm-up stops after this long; shapes not reached run cold "
        f"(default {config_module.DEFAULT_WARMUP_SECONDS})",
    ),
    (
        "example_shape",
        CommaList(AT_LEAST_1),
        "per-item input shape, e.g. 3,224,224: warm up with zeros of it "
        "(for handlers without an example item, such as torchscript)",
    ),
    (
        "drain_seconds",
        AT_LEAST_0,
        "after SIGTERM, keep serving while batches still arrive, at most this long "
        f"(default {config_module.DEFAULT_DRAIN_SECONDS})",
    ),
    (
        "pipeline",
        click.BOOL,
        "preprocess the next batch on a thread of its own while the model runs one "
        "(default true; for handlers that allow it)",
    ),
)


def _with_options(function: Callable[..., None]) -> Callable[..., None]:
    # click converts and bounds each option; config.parse adds defaults and cross-checks.
    # An empty environment variable counts as unset, as click reads it.
    for name, kind, help_text in reversed(OPTIONS):
        flag = "--" + name.replace("_", "-")
        envvar = config_module.ENV_PREFIX + name.upper()
        function = click.option(
            flag, name, type=kind, envvar=envvar, show_envvar=True, help=help_text
        )(function)
    return function


@click.command("model-server")
@_with_options
@click.option(
    "--require-gpu",
    is_flag=True,
    envvar=config_module.ENV_PREFIX + "REQUIRE_GPU",
    show_envvar=True,
    help="exit at once unless torch sees a CUDA device (pods with a GPU set it)",
)
@click.option(
    "--termination-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_PATH,
    show_default=True,
    envvar=config_module.ENV_PREFIX + "TERMINATION_LOG",
    show_envvar=True,
    help="file that gets the reason of a failed start (the pod's terminationMessagePath)",
)
def command(require_gpu: bool, termination_log: Path, **options: Any) -> None:
    """Serve a torch model: each batch (framed stream or POST /batch) runs in one forward pass."""
    try:
        config = config_module.parse(cast(config_module.Options, options))
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if require_gpu:
        from carpool_model_server.device import GpuMissing, require_cuda

        try:
            require_cuda(config.device)
        except GpuMissing as error:
            write_termination_message(str(error), termination_log)
            raise click.ClickException(str(error)) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        code, still_loading = event_loop.run(serve(config, termination_log))
    except ConfigError as error:
        # A handler that does not import is found here; the pod's status should say so too.
        write_termination_message(f"{LOAD_FAILED}{error}", termination_log)
        raise click.UsageError(str(error)) from error
    if still_loading:
        # The worker thread cannot be interrupted and the interpreter would join it at exit:
        # leave without waiting for a load (minutes, for a large model) nobody will use.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


async def serve(config: Config, termination_log: Path = DEFAULT_PATH) -> tuple[int, bool]:
    """Run until SIGTERM/SIGINT (exit 0) or a failed load (exit 1, its reason written to
    `termination_log`, where Kubernetes reads a container's termination message and the
    operator finds it for ModelLoadFailed).

    Returns the exit code, and whether the model was still loading when the signal came.
    """
    # Imported here so `--help` and config errors do not wait for torch.
    from carpool_model_server.app import data_app, probe_app
    from carpool_model_server.build import build_service
    from carpool_model_server.frame_server import FrameServer

    service = build_service(config)
    frame_server = FrameServer(service)
    if config.socket is not None:
        frame_socket = Path(frames.socket_for(config.socket))
        _remove_stale_socket(config.socket)
        _remove_stale_socket(frame_socket)
        runners = [await _listen(data_app(service), config.socket)]
        await frame_server.start(frame_socket)
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
    loading = asyncio.create_task(
        service.start(config.torch_threads, config.warmup_sizes, config.warmup_seconds)
    )
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loading.done() and (failure := loading.exception()) is not None:
        log.error("model failed to load", exc_info=failure)
        message = f"{LOAD_FAILED}{type(failure).__name__}: {failure}"
        write_termination_message(message, termination_log)
        code = 1
    elif not stop.is_set():
        log.info("ready: %s", config.model_name)
        heap.ready_to_serve()
        await stopping
    still_loading = not loading.done()
    if still_loading:
        log.info("stopped while the model was loading: not waiting for the load")
    elif code == 0:
        await _drain(service, config.drain_seconds)
    log.info("shutting down")
    stopping.cancel()
    await frame_server.close(SHUTDOWN_TIMEOUT_S)
    for runner in runners:
        await runner.cleanup()  # waits for requests in flight, up to SHUTDOWN_TIMEOUT_S
    if still_loading:
        return code, True
    # Joins the worker thread: the batch in progress finishes first.
    await asyncio.to_thread(service.close)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await loading
    return code, False


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
