"""`carpool render -f bm.yaml`: print a BatchedModel's child manifests as a YAML stream.

Each BatchedModel is first checked as the API server would check it (the CRD's schema and CEL
rules, see schema.py), then as the operator would (spec.py). Every problem is one line on
stderr, `NAME: FIELD: MESSAGE`; any problem means exit code 2 and no output.
"""

from __future__ import annotations

from typing import IO, Any

import click
import yaml

from carpool_operator.options import default_options, defaults_from
from carpool_operator.render import KIND, render
from carpool_operator.schema import admit
from carpool_operator.spec import SpecError
from carpool_operator.types import Manifest

INVALID = 2


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated values out in full: kubectl and humans read no `&id001` anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _children(
    document: Manifest, defaults: Any, podmonitor: bool
) -> tuple[list[Manifest], list[str]]:
    metadata = document.get("metadata")
    name = str(metadata.get("name", "?")) if isinstance(metadata, dict) else "?"
    admitted, causes = admit(document)
    if causes:
        return [], [f"{name}: {cause.field}: {cause.message}" for cause in causes]
    try:
        return render(admitted, defaults=defaults, podmonitor_api=podmonitor), []
    except SpecError as error:
        return [], [f"{name}: {error.reason}: {error.message}"]


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
    ones your operator runs with to see what it renders. Exit code 2: the file holds a
    BatchedModel that the API server or the operator would refuse (one line per problem).
    """
    defaults = defaults_from(context)
    try:
        documents = list(yaml.safe_load_all(source))
    except yaml.YAMLError as error:
        click.echo(f"{source.name}: not YAML: {error}".replace("\n", " "), err=True)
        context.exit(INVALID)
    manifests: list[Manifest] = []
    problems: list[str] = []
    for document in documents:
        if not isinstance(document, dict) or document.get("kind") != KIND:
            continue
        children, found = _children(document, defaults, podmonitor)
        manifests += children
        problems += found
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        context.exit(INVALID)
    click.echo(yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False), nl=False)
