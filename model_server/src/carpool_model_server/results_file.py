"""The output file of `carpool infer`: one JSON line per input line, resumable.

While a run goes on, each batch's lines are appended as it finishes (longest items first,
so not in input order), each carrying the `index` of its input line, and flushed: a run that
stops loses at most the line it was writing. The next run keeps every whole line, skips
those indices, and once all are answered rewrites the file in input order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import orjson


def answered(path: Path) -> set[int]:
    """Indices already in the file; a torn last line (from a stopped run) is cut off."""
    if not path.exists():
        return set()
    done: set[int] = set()
    kept = 0
    with path.open("rb") as file:
        for line in file:
            try:
                done.add(int(orjson.loads(line)["index"]))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                break
            kept += len(line)
    if kept != path.stat().st_size:
        os.truncate(path, kept)
    return done


def append(file: IO[bytes], index: int, answer: dict[str, Any]) -> None:
    file.write(orjson.dumps({"index": index, **answer}, option=orjson.OPT_APPEND_NEWLINE))


def put_in_order(path: Path) -> None:
    """Rewrite the file sorted by index, atomically."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines.sort(key=lambda line: int(orjson.loads(line)["index"]))
    temporary = path.with_name(path.name + ".sorting")
    temporary.write_bytes(b"".join(lines))
    os.replace(temporary, path)
