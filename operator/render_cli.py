"""`carpool render -f bm.yaml`: print a BatchedModel's child manifests as a YAML stream."""

from __future__ import annotations

from typing import IO

import click
import yaml

from carpool.operator.options import default_options, defaults_from
from carpool.operator.render import KIND, render
from carpool.operator.spec import SpecError


@click.command()
@click.option(
    "-f",
    "--filename",
    "source",
    type=click.File("r"),
    required=True,
    help="A YAML file (or - for stdin) with one or more BatchedModel objects.",
)
@default_options
@click.option(
    "--podmonitor/--no-podmonitor",
    default=False,
    show_default=True,
    help="Whether the cluster serves monitoring.coreos.com (PodMonitor).",
)
@click.pass_context
def command(context: click.Context, source: IO[str], podmonitor: bool) -> None:
    """Print the manifests the operator would create for each BatchedModel in a file.

    The --default-* options (and CARPOOL_DEFAULT_* variables) are the operator's: pass the
    ones your operator runs with to see what it renders.
    """
    defaults = defaults_from(context)
    manifests = []
    for document in yaml.safe_load_all(source):
        if not isinstance(document, dict) or document.get("kind") != KIND:
            continue
        try:
            manifests += render(document, defaults=defaults, podmonitor_api=podmonitor)
        except SpecError as error:
            name = document.get("metadata", {}).get("name", "?")
            raise click.ClickException(f"{name}: {error.reason}: {error.message}") from error
    click.echo(yaml.safe_dump_all(manifests, sort_keys=False), nl=False)
