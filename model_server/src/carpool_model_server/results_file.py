"""The output file of `carpool infer`: a header, then one JSON line per input line, resumable.

The header binds the file to its run: the input's SHA-256, the handler and the model path.
A run writes it first, then appends each batch's lines as it finishes (longest items first,
so not in input order), each carrying the `index` of its input line, and flushes them: a run
that stops loses at most the line it was writing. The next run of the same input, handler
and model keeps every whole line, skips those indices, and once all are answered rewrites
the file in input order, header first. A file with another header, or none, is not touched:
it is another run's answers, or not answers at all.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO, NoReturn

import orjson

HEADER_KEY = "carpool_infer"
FORMAT = 1


class NotThisRun(Exception):
    """An output that this run must not resume; the message says why."""


def read_input(path: Path) -> tuple[list[bytes], str]:
    """The input's lines and its SHA-256, from one read: a pipe is read once only."""
    digest = hashlib.sha256()
    lines = []
    with path.open("rb") as data:
        for line in data:
            digest.update(line)
            lines.append(line)
    return lines, digest.hexdigest()


def header(
    input_sha256: str,
    handler: str,
    model_path: Path | None,
    options: Mapping[str, str] | None = None,
) -> bytes:
    """The header line of a run of `handler` (with `model_path` and its `options`, which
    change its answers) over an input."""
    run: dict[str, object] = {
        HEADER_KEY: FORMAT,
        "input_sha256": input_sha256,
        "handler": handler,
        "model_path": None if model_path is None else str(model_path.resolve()),
    }
    if options:
        run["options"] = dict(sorted(options.items()))
    return orjson.dumps(run, option=orjson.OPT_APPEND_NEWLINE)


def resume(file: BinaryIO, run_header: bytes) -> set[int]:
    """The indices already answered in `file` (open "ab+") by this run; a new file starts
    with its header.

    Raises NotThisRun for a file that holds anything else. A torn last line (from a stopped
    run) is cut off; so is a torn header, all a stopped run may have written.
    """
    file.seek(0)
    first = file.readline()
    if first != run_header:
        if not run_header.startswith(first):
            _refuse(first, run_header)
        file.truncate(0)
        file.write(run_header)
        return set()
    done: set[int] = set()
    kept = len(first)
    for line in file:
        if not line.endswith(b"\n"):
            break  # torn, even where what was written is whole JSON: its newline is missing
        try:
            done.add(int(orjson.loads(line)["index"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            break
        kept += len(line)
    file.truncate(kept)
    return done


def _refuse(first: bytes, run_header: bytes) -> NoReturn:
    """Why a file whose first line is `first` is not this run's output."""
    try:
        theirs = orjson.loads(first)
        ours = orjson.loads(run_header)
        if not (isinstance(theirs, dict) and theirs.get(HEADER_KEY) == FORMAT):
            raise ValueError
    except ValueError:
        raise NotThisRun("is not an output of carpool infer; give another --output") from None
    if theirs.get("input_sha256") != ours["input_sha256"]:
        raise NotThisRun("holds the answers of another input; give another --output")
    raise NotThisRun(
        f"holds the answers of another handler or model ({theirs.get('handler')}, "
        f"{theirs.get('model_path')}); give another --output"
    )


def append(file: IO[bytes], index: int, answer: dict[str, Any]) -> None:
    file.write(orjson.dumps({"index": index, **answer}, option=orjson.OPT_APPEND_NEWLINE))


def put_in_order(path: Path) -> None:
    """Rewrite the file sorted by index, header first, atomically."""
    first, *lines = path.read_bytes().splitlines(keepends=True)
    lines.sort(key=lambda line: int(orjson.loads(line)["index"]))
    temporary = path.with_name(path.name + ".sorting")
    try:
        temporary.write_bytes(first + b"".join(lines))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # the file itself is whole, if unsorted
        raise
