"""`carpool operator`: run the kopf operator that turns BatchedModels into pods."""

from __future__ import annotations

import asyncio
import contextlib

import click
import kopf
from prometheus_client import CollectorRegistry

from carpool_operator.defaults import Defaults
from carpool_operator.handlers import register
from carpool_operator.metrics import OperatorMetrics, serving
from carpool_operator.options import default_options, defaults_from


async def _operate(
    registry: kopf.OperatorRegistry,
    metrics: OperatorMetrics,
    defaults: Defaults,
    *,
    metrics_address: tuple[str, int] | None,
    standalone: bool,
    namespaces: tuple[str, ...],
    liveness: str,
    resync_seconds: float,
) -> None:
    """kopf, with the metrics server started before it and stopped after it."""
    async with contextlib.AsyncExitStack() as stack:
        if metrics_address is not None:
            host, port = metrics_address
            try:
                await stack.enter_async_context(serving(metrics.registry, host, port))
            except OSError as error:
                message = f"--metrics-port {port}: cannot listen on {host}: {error.strerror}"
                raise click.ClickException(message) from error
        await kopf.operator(
            registry=registry,
            standalone=standalone,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness or None,
            memo=kopf.Memo(
                defaults=defaults,
                metrics=metrics,
                namespaces=namespaces,
                resync_seconds=resync_seconds,
            ),
        )


@click.command()
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch only this namespace (repeatable); default: all namespaces.",
)
@click.option(
    "--liveness",
    "liveness",
    default="http://0.0.0.0:8081/healthz",
    show_default=True,
    help="The liveness endpoint; an empty value turns it off.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    envvar="CARPOOL_METRICS_PORT",
    default=8080,
    show_default=True,
    help="The port of the operator's Prometheus /metrics; 0 turns it off.",
)
@click.option(
    "--metrics-host",
    envvar="CARPOOL_METRICS_HOST",
    default="127.0.0.1",
    show_default=True,
    help="The address /metrics listens on (0.0.0.0 in a pod, for Prometheus).",
)
@click.option(
    "--standalone/--peering",
    default=True,
    show_default=True,
    help="Run without kopf peering (the operator runs as a single replica).",
)
@default_options
@click.option(
    "--resync-seconds",
    type=click.FloatRange(min=0.1),
    envvar="CARPOOL_RESYNC_SECONDS",
    default=60.0,
    show_default=True,
    help="How often every BatchedModel is compared with its children even without events.",
)
@click.option("--verbose", is_flag=True, help="Log kopf's debug messages.")
@click.pass_context
def command(
    context: click.Context,
    namespaces: tuple[str, ...],
    liveness: str,
    metrics_port: int,
    metrics_host: str,
    standalone: bool,
    resync_seconds: float,
    verbose: bool,
) -> None:
    """Run the BatchedModel operator."""
    # Every setting is checked before kopf starts: a bad one stops the operator at once.
    defaults = defaults_from(context)
    kopf.configure(verbose=verbose)
    registry = kopf.OperatorRegistry()
    register(registry)
    metrics = OperatorMetrics(CollectorRegistry())
    operate = _operate(
        registry,
        metrics,
        defaults,
        metrics_address=(metrics_host, metrics_port) if metrics_port else None,
        standalone=standalone,
        namespaces=namespaces,
        liveness=liveness,
        resync_seconds=resync_seconds,
    )
    # kopf stops on SIGINT/SIGTERM by itself; a cancellation at that point is no error.
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(operate)
