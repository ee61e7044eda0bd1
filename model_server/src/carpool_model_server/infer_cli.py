"""`carpool infer`: a handler run in process over a JSON-lines file, resumable.

It resumes only its own run: an output whose header names this input (by content), handler
and model (`results_file`). Any other file given as --output, the input itself included, is
refused with one line and left as it was.
"""

from __future__ import annotations

import errno
import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click
import orjson

from carpool.comma_list import CommaList, KeyValue
from carpool_model_server.items import result_to_json
from carpool_model_server.offline import DEFAULT_BATCH_SIZE, BatchInference
from carpool_model_server.results_file import (
    NotThisRun,
    append,
    header,
    put_in_order,
    read_input,
    resume,
)

# What a write answers when the output cannot grow: a full disk or quota, a file-size limit.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@click.command()
@click.option(
    "--handler",
    required=True,
    help="text-embedding, text-classification, image-classification, module:Class...",
)
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='JSON lines: an object of inputs per line (a BYTES input may be {"file": PATH}, '
    "relative to this file's folder; max_tokens is max_new_tokens), or a string for a text "
    "first input.",
)
@click.option(
    "--output",
    "output_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON lines: a header, then one per input line with its 0-based index; resumed if "
    "it holds this run's header.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH_SIZE)
@click.option("--model-path", type=click.Path(exists=True, path_type=Path), default=None)
@click.option(
    "--handler-options",
    type=CommaList(KeyValue()),
    default=None,
    help="The handler's own settings, as for carpool model-server, e.g. top_k=5.",
)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda:N")
@click.option("--torch-threads", type=click.IntRange(min=1), default=None)
@click.option(
    "--sort/--no-sort", default=True, show_default=True, help="Batch items of similar length."
)
def command(
    handler: str,
    input_path: Path,
    output_path: Path,
    batch_size: int,
    model_path: Path | None,
    handler_options: tuple[tuple[str, str], ...] | None,
    device: str,
    torch_threads: int | None,
    sort: bool,
) -> None:
    """Run a handler over every line of a file; results come out in input order."""
    started = time.monotonic()
    lines, input_sha256 = read_input(input_path)
    if output_path.exists():
        if output_path.samefile(input_path):
            raise click.ClickException(f"--output {output_path} is the input file; give another")
        if not output_path.is_file():
            # It is rewritten in place at the end: a device or a pipe must not be replaced.
            raise click.ClickException(f"--output {output_path} is not a regular file")
    try:
        output = output_path.open("ab+")
    except OSError as error:
        raise click.ClickException(
            f"cannot write --output {output_path}: {error.strerror}"
        ) from None
    with _full_is_one_line(output_path), output:
        try:
            # Held until the run ends: two runs appending to one file would answer twice.
            fcntl.flock(output, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise click.ClickException(
                f"--output {output_path} is being written by another carpool infer"
            ) from None
        try:
            options = dict(handler_options or ())
            run_header = header(input_sha256, handler, model_path, options)
            done = resume(output, run_header)
        except NotThisRun as refusal:
            raise click.ClickException(f"--output {output_path} {refusal}") from None
        if done:
            click.echo(f"resuming: {len(done)} lines already answered", err=True)
        pending: list[tuple[int, Any]] = []
        for index, line in enumerate(lines):
            if index in done:
                continue
            try:
                pending.append((index, orjson.loads(line)))
            except orjson.JSONDecodeError as error:
                message = f"line {index + 1} is not JSON: {error}"
                append(output, index, {"error": message, "status": 400})
        if pending:
            settings = _Settings(batch_size, model_path, options, device, torch_threads, sort)
            _run(handler, pending, output, settings, input_path.parent)
        output.flush()
        put_in_order(output_path)
    click.echo(f"wrote {output_path} in {time.monotonic() - started:.1f}s", err=True)


@contextmanager
def _full_is_one_line(output_path: Path) -> Iterator[None]:
    """A write to the output that stopped part way: one line, and every whole line before it
    kept for the next run to resume."""
    try:
        yield
    except OSError as error:
        if error.errno not in FULL:
            raise
        raise click.ClickException(
            f"cannot write --output {output_path}: {error.strerror}; the answers written are "
            "kept: make room and run the same command again to go on"
        ) from None


@dataclass(frozen=True, slots=True)
class _Settings:
    batch_size: int
    model_path: Path | None
    options: dict[str, str]
    device: str
    torch_threads: int | None
    sort: bool


def _run(
    handler: str,
    pending: list[tuple[int, Any]],
    output: IO[bytes],
    settings: _Settings,
    base: Path,
) -> None:
    try:
        inference = BatchInference(
            handler,
            batch_size=settings.batch_size,
            model_path=settings.model_path,
            device=settings.device,
            torch_threads=settings.torch_threads,
            options=settings.options,
        )
    except ValueError as error:  # an option the handler refuses
        raise click.ClickException(str(error)) from None
    with inference:
        records = [record for _, record in pending]
        with click.progressbar(length=len(records), label="infer") as bar:
            runs = inference.run(records, sort_by_length=settings.sort, base=base)
            for positions, results in runs:
                for position, result in zip(positions, results, strict=True):
                    append(output, pending[position][0], result_to_json(result))
                output.flush()
                bar.update(len(positions))
        click.echo(inference.stats.summary(), err=True)
