"""`carpool sidecar`: parse the settings, serve, drain on SIGTERM, exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from aiohttp import web
from prometheus_client import CollectorRegistry

from carpool import event_loop, heap
from carpool.contract.pod import MODEL_SERVER_URL
from carpool.engine.settings import BatchingSettings, ConfigError
from carpool.knob_flags import knob_options, knob_values
from carpool_sidecar.app import front_app
from carpool_sidecar.build import build_sidecar
from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.fronts import parent
from carpool_sidecar.grpc import server as grpc_server
from carpool_sidecar.runner import CannotListen, app_runner, listening, signalled

log = logging.getLogger("carpool_sidecar")
DEFAULTS = BatchingSettings()
CONFIG = SidecarConfig(model_name="-", model_server=MODEL_SERVER_URL)
F = TypeVar("F", bound=Callable[..., None])


def _option(flag: str, kind: Any, default: object, help_text: str) -> Callable[[F], F]:
    envvar = "CARPOOL_" + flag.upper().replace("-", "_")
    return click.option(
        f"--{flag}", type=kind, default=default, envvar=envvar, show_default=True,
        help=f"{help_text} [{envvar}]",
    )  # fmt: skip


@click.command("sidecar")
@_option("model-name", str, None, "model name served in URLs (required)")
@_option("model-server", str, MODEL_SERVER_URL, "unix://PATH or http://HOST:PORT")
@_option("host", str, CONFIG.host, "listen address (0.0.0.0 in pods)")
@_option("port", int, CONFIG.port, "listen port")
@_option("config-file", click.Path(dir_okay=False), None, "batching settings JSON, live reload")
@knob_options(DEFAULTS)
@_option("max-body-bytes", int, CONFIG.max_body_bytes, "largest request body (413 above)")
@_option("body-timeout-seconds", float, CONFIG.body_timeout_s, "body idle this long: 408")
@_option("max-reading-bytes", int, CONFIG.max_reading_bytes, "bodies being read: 503 above")
@_option("max-answer-bytes", int, CONFIG.max_answer_bytes, "largest answer (413 above)")
@_option("max-unsent-bytes", int, CONFIG.max_unsent_bytes, "answers not yet sent: 503 above")
@_option("drain-seconds", float, CONFIG.drain_seconds, "grace to finish queued work on SIGTERM")
@_option("drain-delay-seconds", float, CONFIG.drain_delay_seconds, "not ready, still serving")
@_option("grpc-port", int, CONFIG.grpc_port, "gRPC (Open Inference Protocol) listen port, 0: off")
@_option("grpc-max-message-bytes", int, None, "largest gRPC message [default: max-body-bytes]")
@_option(
    "front-processes",
    int,
    CONFIG.front_processes,
    "processes that serve REST, >1: one more batches",
)
def command(
    model_name: str | None,
    model_server: str,
    host: str,
    port: int,
    config_file: str | None,
    max_body_bytes: int,
    body_timeout_seconds: float,
    max_reading_bytes: int,
    max_answer_bytes: int,
    max_unsent_bytes: int,
    drain_seconds: float,
    drain_delay_seconds: float,
    grpc_port: int,
    grpc_max_message_bytes: int | None,
    front_processes: int,
    **knobs: Any,
) -> None:
    """Batch inference requests for a co-located model server."""
    try:
        if not model_name:
            raise ConfigError("model-name: required (--model-name or CARPOOL_MODEL_NAME)")
        batching = BatchingSettings(**knob_values(knobs))
        config = SidecarConfig(
            model_name=model_name,
            model_server=model_server,
            host=host,
            port=port,
            config_file=config_file,
            max_body_bytes=max_body_bytes,
            body_timeout_s=body_timeout_seconds,
            max_reading_bytes=max_reading_bytes,
            max_answer_bytes=max_answer_bytes,
            max_unsent_bytes=max_unsent_bytes,
            drain_seconds=drain_seconds,
            drain_delay_seconds=drain_delay_seconds,
            batching=batching,
            grpc_port=grpc_port,
            grpc_max_message_bytes=grpc_max_message_bytes,
            front_processes=front_processes,
        )
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        sys.exit(event_loop.run(serve(config)))
    except CannotListen as error:
        raise click.ClickException(str(error)) from error


async def serve(config: SidecarConfig) -> int:
    """Serve until SIGTERM/SIGINT; then not ready but serving for the drain delay, then
    closed to new connections and drained: nothing sent before the port closed is lost."""
    if config.front_processes > 1:
        return await parent.serve(config)
    sidecar = build_sidecar(config, CollectorRegistry())
    app = front_app(sidecar)
    runner = await app_runner(app, config)
    # Unwound in reverse: gRPC stops once the drain has answered its calls, then the runner
    # closes idle keep-alive connections and waits for the answers still being written. On a
    # failed start too, so the app's background tasks end before the loop does.
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, config.host, config.port)
        await listening(site.start(), f"{config.host}:{config.port}")
        log.info("sidecar for %r listening on %s", config.model_name, site.name)
        # gRPC: beside REST over the same data plane.
        grpc_address = f"{config.host}:{config.grpc_port} (gRPC)"
        serving = grpc_server.serving(config, sidecar)
        await listening(stack.enter_async_context(serving), grpc_address)
        heap.ready_to_serve()
        await signalled()
        # Not ready at once, but serving on: endpoints and load balancers take a while to stop
        # sending, and a request that finds the port closed is lost.
        sidecar.dataplane.stop_soon()
        log.info(
            "not ready; serving %.1f s more before closing the port", config.drain_delay_seconds
        )
        await asyncio.sleep(config.drain_delay_seconds)
        sending = sidecar.sending
        sending.drained_by = asyncio.get_running_loop().time() + config.drain_seconds
        # Open connections stay; each answers with Connection: close from the SIGTERM on.
        await site.stop()
        await sidecar.drain(sending.drain_left_s())
        # Answers still unread by the end of the grace are cut: the exit keeps its promise.
        await sending.finish(sending.drain_left_s())
    log.info("sidecar stopped")
    return 0
