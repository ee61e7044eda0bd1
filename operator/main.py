"""`carpool operator`: run the kopf operator that turns BatchedModels into pods."""

from __future__ import annotations

import click
import kopf

from carpool.operator.handlers import register
from carpool.operator.reconcile import OperatorConfig
from carpool.operator.render import DEFAULT_IMAGE


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
    "--standalone/--peering",
    default=True,
    show_default=True,
    help="Run without kopf peering (the operator runs as a single replica).",
)
@click.option(
    "--default-image",
    envvar="CARPOOL_DEFAULT_IMAGE",
    default=DEFAULT_IMAGE,
    show_default=True,
    help="The image for BatchedModels that name none.",
)
@click.option(
    "--resync-seconds",
    type=click.FloatRange(min=0.1),
    envvar="CARPOOL_RESYNC_SECONDS",
    default=60.0,
    show_default=True,
    help="How often every BatchedModel is compared with its children even without events.",
)
@click.option("--verbose", is_flag=True, help="Log kopf's debug messages.")
def command(
    namespaces: tuple[str, ...],
    liveness: str,
    standalone: bool,
    default_image: str,
    resync_seconds: float,
    verbose: bool,
) -> None:
    """Run the BatchedModel operator."""
    kopf.configure(verbose=verbose)
    registry = kopf.OperatorRegistry()
    register(registry, resync_seconds)
    config = OperatorConfig(default_image=default_image)
    kopf.run(
        registry=registry,
        standalone=standalone,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness or None,
        memo=kopf.Memo(config=config),
    )
