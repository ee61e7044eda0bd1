"""`carpool render -f bm.yaml`: print a BatchedModel's child manifests as a YAML stream.

The file is untrusted input: it is read within bounds (bounded_yaml.py) and each of its
documents must be a Kubernetes object; those of the CRD's group or kind must be the
BatchedModel the CRD serves, with a name (documents.py). Other objects (a Namespace beside
the models) are skipped. Each BatchedModel is then checked as the API server would check it
(the CRD's schema and CEL rules, see schema.py), its free-form parts against Kubernetes' own
schemas (free_form.py, when kubernetes-validate is installed; else a warning says what was
not checked), then as the operator would (spec.py), and its children for keys that two items
of a list share, which server-side apply refuses (merge_keys.py).

A problem with the file is one line `Error: FILE: [line L: ]PROBLEM`; a problem with a
BatchedModel is one line `NAME: FIELD: MESSAGE`. Any problem means exit code 2 and no output.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import yaml

from carpool_operator import free_form
from carpool_operator.bounded_yaml import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_DOCUMENTS,
    Document,
    YamlInputError,
    load_documents,
    read_bounded,
)
from carpool_operator.documents import DocumentProblem, batched_model, metadata_causes
from carpool_operator.merge_keys import refuse_duplicates
from carpool_operator.options import default_options, defaults_from
from carpool_operator.render import render
from carpool_operator.schema import admit, served
from carpool_operator.spec import SpecError
from carpool_operator.types import Manifest

INVALID = 2
STDIN = "-"


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated values out in full: kubectl and humans read no `&id001` anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class FileProblem(Exception):
    """Why the file cannot be read as YAML documents."""


def _read(path: str) -> list[Document]:
    try:
        if path == STDIN:
            data = read_bounded(sys.stdin.buffer)
        else:
            with open(path, "rb") as stream:
                data = read_bounded(stream)
        return load_documents(data)
    except OSError as error:
        raise FileProblem(f"cannot read it: {error.strerror or error}") from None
    except YamlInputError as error:
        where = f"{error.where}: " if error.where else ""
        raise FileProblem(where + error.message) from None


def _children(
    document: Manifest, defaults: Any, podmonitor: bool, unchecked: set[str]
) -> tuple[list[Manifest], list[str]]:
    """The BatchedModel's children, or one line per problem; `unchecked` collects the
    free-form parts left unchecked for want of kubernetes-validate."""
    name = document["metadata"]["name"]
    admitted, causes = admit(document)
    causes = metadata_causes(document) + causes
    if free_form.available():
        causes += free_form.check(admitted)
    else:
        unchecked.update(pattern for pattern, _, _ in free_form.parts(admitted))
    if causes:
        return [], [f"{name}: {cause.field}: {cause.message}" for cause in causes]
    try:
        children = render(admitted, defaults=defaults, podmonitor_api=podmonitor)
        refuse_duplicates(children)
        return children, []
    except SpecError as error:
        return [], [f"{name}: {error.reason}: {error.message}"]


def _render_file(
    path: str, defaults: Any, podmonitor: bool, unchecked: set[str]
) -> tuple[list[Manifest], list[str]]:
    """The children of every BatchedModel in the file, and one line per problem."""
    label = "<stdin>" if path == STDIN else path

    def line_of(message: str, line: int | None = None) -> str:
        where = f"line {line}: " if line is not None else ""
        return f"Error: {label}: {where}{message}"

    try:
        documents = _read(path)
    except FileProblem as problem:
        return [], [line_of(str(problem))]
    manifests: list[Manifest] = []
    problems: list[str] = []
    models = 0
    for document in documents:
        try:
            body = batched_model(document)
        except DocumentProblem as problem:
            problems.append(line_of(problem.message, problem.line))
            continue
        if body is None:
            continue
        models += 1
        children, found = _children(body, defaults, podmonitor, unchecked)
        manifests += children
        problems += found
    if not models and not problems:
        api_version, kind = served()
        problems.append(line_of(f"no {kind} in it (apiVersion {api_version})"))
    return manifests, problems


@click.command(
    epilog=(
        f"Bounds: at most {MAX_BYTES} bytes, {MAX_DOCUMENTS} YAML documents, {MAX_DEPTH} levels "
        "of nesting; no YAML anchors or aliases."
    )
)
@click.option(
    "-f",
    "--filename",
    "source",
    required=True,
    metavar="FILE",
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
def command(context: click.Context, source: str, podmonitor: bool) -> None:
    """Print the manifests the operator would create for each BatchedModel in a file.

    The --default-* options (and CARPOOL_DEFAULT_* variables) are the operator's: pass the
    ones your operator runs with to see what it renders. Exit code 2: the file is not one
    carpool render reads, or holds a BatchedModel that the API server or the operator would
    refuse (one line per problem).
    """
    defaults = defaults_from(context)
    unchecked: set[str] = set()
    manifests, problems = _render_file(source, defaults, podmonitor, unchecked)
    for problem in problems:
        click.echo(problem, err=True)
    if unchecked:
        parts = ", ".join(pattern for pattern in free_form.FREE_FORM if pattern in unchecked)
        version = free_form.KUBERNETES_VERSION
        click.echo(
            f"Warning: {parts} not checked against Kubernetes {version}'s schemas: "
            f"install {free_form.EXTRA} (kubernetes-validate) to check them",
            err=True,
        )
    if problems:
        context.exit(INVALID)
    click.echo(yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False), nl=False)
