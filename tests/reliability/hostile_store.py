"""`python -m carpool.storage`, the weights init container, against a store that attacks it.

One implementation for the quick test (`test_hostile_store.py`) and the soak (`bench/soak.py
hostile_store`). An HTTP server on 127.0.0.1, counting the requests for each path, serves:
a folder whose index pages link out of it (`../../x`, `%2e%2e/`, absolute paths, queries)
and back into themselves, several levels deep; a tar.gz bomb (members of 1 MiB
of zeros, together far past the bound it is fetched with); a zip of more members than MAX_FILES.
"""

from __future__ import annotations

import functools
import gzip
import io
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from carpool.storage import MAX_FILES

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Plan:
    depth: int = 4  # levels of folders, each with a hostile index page
    bomb_mib: int = 256  # what the bomb's member unpacks to
    max_unpacked_mib: int = 16  # the bound the bomb is fetched with
    fetch_within_s: float = 60.0


@dataclass
class Fetched:
    code: int
    seconds: float
    last_line: str
    files: set[str]  # under the run's folder, the target's parents included
    written: int  # bytes of those files


@dataclass
class Report:
    folder: Fetched | None = None
    pages_read: Counter[str] = field(default_factory=Counter)  # index page -> GETs
    expected_files: set[str] = field(default_factory=set)
    bomb: Fetched | None = None
    many: Fetched | None = None


class _Counting(SimpleHTTPRequestHandler):
    counts: Counter[str]

    def do_GET(self) -> None:
        self.counts[self.path] += 1
        super().do_GET()

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def _site(root: Path, counts: Counter[str]) -> Iterator[str]:
    handler = functools.partial(
        type("Handler", (_Counting,), {"counts": counts}), directory=str(root)
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    root = folder / "site"
    root.mkdir()
    (root / "escaped.txt").write_bytes(b"outside")
    report.expected_files = _hostile_folder(root / "weights", plan.depth)
    _bomb(root / "bomb.tar.gz", plan.bomb_mib << 20)
    _many(root / "many.zip", MAX_FILES + 1)
    with _site(root, report.pages_read) as url:
        report.folder = _fetch(f"{url}/weights/", folder / "folder", plan)
        bound = str(plan.max_unpacked_mib << 20)
        report.bomb = _fetch(f"{url}/bomb.tar.gz", folder / "bomb", plan, bound)
        report.many = _fetch(f"{url}/many.zip", folder / "many", plan)
    return report


def _hostile_folder(folder: Path, depth: int) -> set[str]:
    """Folders `depth` deep, each with a file and an index page linking out and around."""
    expected = set()
    level = folder
    for n in range(depth):
        level.mkdir(parents=True)
        (level / f"shard-{n}.bin").write_bytes(bytes([n]) * 1000)
        expected.add((level / f"shard-{n}.bin").relative_to(folder).as_posix())
        climb = "../" * (n + 2)
        links = [
            f"shard-{n}.bin",
            "next/" if n + 1 < depth else "",
            f"{climb}escaped.txt",  # fsspec joins it to the page's URL
            "%2e%2e/%2e%2e/escaped.txt",
            "/escaped.txt",
            f"shard-{n}.bin?download=1",
            "./",
            "../" if n else "",  # back up: already read
            f"{climb}weights/",  # the top, again
        ]
        (level / "index.html").write_text(
            "".join(f'<a href="{link}">{link}</a>\n' for link in links if link)
        )
        level = level / "next"
    return expected


def _bomb(path: Path, size: int) -> None:
    """A tar.gz of `size` zero bytes in members of 1 MiB: each under any bound, together far
    over it (a few hundred kB per GiB)."""
    with (
        path.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w|") as tar,
    ):
        for n in range(size // _CHUNK):
            info = tarfile.TarInfo(f"shard-{n}.safetensors")
            info.size = _CHUNK
            tar.addfile(info, _Zeros(_CHUNK))


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        count = self.left if size < 0 else min(size, self.left, _CHUNK)
        self.left -= count
        return bytes(count)


def _many(path: Path, count: int) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for n in range(count):
            archive.writestr(f"shard-{n}", b"")


def _fetch(uri: str, target: Path, plan: Plan, max_unpacked: str | None = None) -> Fetched:
    run_folder = target.parent / (target.name + "-run")
    destination = run_folder / "a" / "b" / "models"
    extra = [] if max_unpacked is None else ["--max-unpacked-bytes", max_unpacked]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "carpool.storage", uri, str(destination), *extra],
        capture_output=True,
        text=True,
        timeout=plan.fetch_within_s * 3,
        check=False,
    )
    seconds = time.monotonic() - started
    files = {p.relative_to(run_folder).as_posix() for p in run_folder.rglob("*") if p.is_file()}
    written = sum(p.stat().st_size for p in run_folder.rglob("*") if p.is_file())
    last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
    return Fetched(done.returncode, seconds, last[0], files, written)


def summary(report: Report) -> str:
    lines = []
    for name, fetched in (("folder", report.folder), ("bomb", report.bomb), ("many", report.many)):
        if fetched is not None:
            lines.append(
                f"{name}: exit {fetched.code} after {fetched.seconds:.2f} s, "
                f"{len(fetched.files)} files, {fetched.written} bytes: {fetched.last_line!r}"
            )
    pages = {path: count for path, count in report.pages_read.items() if path.endswith("/")}
    lines.append(f"index pages read: {pages}")
    return "\n".join(lines)


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    fetched = report.folder
    expected = {f"a/b/models/{name}" for name in report.expected_files}
    if fetched is None or fetched.code != 0 or fetched.files != expected:
        broken.append(f"the folder: {fetched}, expected {sorted(expected)}")
    if any(count > 1 for path, count in report.pages_read.items() if path.endswith("/")):
        broken.append(f"an index page read twice: {report.pages_read}")
    if report.pages_read["/escaped.txt"]:
        broken.append("a file outside the folder was fetched")
    limit = plan.max_unpacked_mib << 20
    for name, archive, words in (
        ("bomb", report.bomb, "unpacks to more than"),
        ("many", report.many, f"more than {MAX_FILES} files"),
    ):
        if archive is None or archive.code != 1 or words not in archive.last_line:
            broken.append(f"{name}: {archive}")
        elif archive.written > limit or archive.seconds >= plan.fetch_within_s:
            broken.append(f"{name}: {archive.written} bytes in {archive.seconds:.2f} s")
    return broken
