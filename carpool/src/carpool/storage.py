"""`python -m carpool.storage URI FOLDER`: put a model's weights in a folder before it starts.

The init container of a BatchedModel with `spec.model.weights.storageUri` runs this. fsspec
does the transfers, so every store it knows works the same way: s3:// (s3fs), gs:// (gcsfs),
hf:// (huggingface_hub's HfFileSystem, `hf://org/repo@revision/sub/folder`), http(s)://.

Layout in FOLDER:
- a folder (a bucket prefix, a Hugging Face repository or an http(s) URL ending in `/`, read
  from its index page's links): its files, with their relative paths;
- an archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .zip): its unpacked contents;
- any other file: that file, under its own name.

What a store lists is input too: every file lands inside FOLDER or the fetch fails. A key
that climbs out of its prefix (`../`) is refused; an index page's links out of its folder
(a parent, another path, a query) are not the folder's files, and each page is read once.
An archive unpacks to at most MAX_FILES files and `--max-unpacked-bytes` bytes, and never
more than FOLDER's disk has free, each counted from the members' headers as it unpacks.

Credentials are what each store's library reads from the environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and FSSPEC_S3_ENDPOINT_URL for S3-compatible stores;
GOOGLE_APPLICATION_CREDENTIALS (a file) for GCS; HF_TOKEN for gated Hugging Face repositories.
With --credentials, the files of a mounted Secret named like variables set them, so that the
secrets stay out of the pod's spec and out of every other process.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit, urlunsplit

import click
import fsspec
import fsspec.config

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
SCHEMES = ("s3", "gs", "hf", "http", "https")
# Files of one folder or one archive, at most: a model has tens, a sharded one hundreds.
MAX_FILES = 100_000
# The most an archive may unpack to, unless --max-unpacked-bytes says otherwise.
MAX_UNPACKED_BYTES = 256 << 30
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class StorageError(Exception):
    """A URI that cannot be fetched; the message says which and why."""


def load_credentials(folder: Path) -> list[str]:
    """Set an environment variable from each file of `folder` named like one; return the names.

    Other files (a GCS key, say) stay files for a variable to point at. A mounted Secret's
    bookkeeping entries (`..data`) never match.
    """
    names = [item.name for item in sorted(folder.iterdir()) if _VARIABLE.match(item.name)]
    for name in names:
        os.environ[name] = (folder / name).read_text().strip()
    # fsspec read its FSSPEC_* settings at import; read them again.
    fsspec.config.set_conf_env(fsspec.config.conf)
    return names


def is_archive(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


def _is_folder(fs: fsspec.AbstractFileSystem, uri: str, path: str) -> bool:
    # An http "folder" is an index page; asking whether a URL is one would download it, which
    # for a weights file means gigabytes. The trailing slash decides instead.
    if uri.startswith(("http://", "https://")):
        return uri.endswith("/")
    return bool(fs.isdir(path))


def _inside(folder: Path, relative: str, source: str) -> Path:
    """Where a file listed as `relative` goes in `folder`; StorageError if anywhere else."""
    parts = relative.split("/")
    if relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StorageError(f"{source} would be written outside {folder}")
    target = folder.joinpath(*parts)
    # A link already in the folder must not lead out of it either.
    if not os.path.realpath(target).startswith(os.path.realpath(folder) + os.sep):
        raise StorageError(f"{source} would be written outside {folder}")
    return target


def _http_files(fs: fsspec.AbstractFileSystem, base: str) -> list[str]:
    """The files under `base` that its index pages link to, each page read once.

    A link out of the folder (to a parent, another path or site, or with a query) is not one
    of its files, however fsspec joined it to the page's URL.
    """
    files: list[str] = []
    pages, seen = [base], {base}
    while pages:
        for name in fs.ls(pages.pop(), detail=False):
            url = _normal_url(name)
            if url is None or not url.startswith(base) or url in seen:
                continue
            seen.add(url)
            if len(seen) > MAX_FILES:
                raise StorageError(f"{base}: more than {MAX_FILES} files")
            (pages if url.endswith("/") else files).append(url)
    return files


def _normal_url(url: str) -> str | None:
    """`url` with its `.` and `..` segments resolved, as a server resolves them; None for a
    link with a query or a fragment, or with dot segments hidden in %-escapes."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        return None
    decoded = unquote(parts.path)
    if decoded != parts.path and {".", ".."} & set(decoded.split("/")):
        return None  # a server would climb with them
    path = posixpath.normpath(parts.path)
    if parts.path.endswith("/") and not path.endswith("/"):
        path += "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True, slots=True)
class _Budget:
    """What an archive may unpack to: MAX_FILES files and `size` bytes, set by `set_by`."""

    size: int
    set_by: str

    def check(self, name: str, files: int, size: int) -> None:
        if files > MAX_FILES:
            raise StorageError(f"{name} holds more than {MAX_FILES} files")
        if size > self.size:
            raise StorageError(f"{name} unpacks to more than {self.size} bytes ({self.set_by})")


def _unpack(archive: Path, folder: Path, max_bytes: int) -> None:
    """Unpack into `folder`, within MAX_FILES, `max_bytes` and the disk's free space."""
    free = shutil.disk_usage(folder).free
    budget = (
        _Budget(max_bytes, "--max-unpacked-bytes")
        if max_bytes <= free
        else _Budget(free, f"the free space of {folder}")
    )
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            members = zipped.infolist()
        # A member's size in the central directory bounds what it unpacks to: zipfile stops
        # there (and fails the CRC) however much its data would inflate.
        budget.check(archive.name, len(members), sum(member.file_size for member in members))
        # shutil's zip unpacker skips absolute and ".." members by itself (and takes no filter).
        shutil.unpack_archive(archive, folder)
        return
    with tarfile.open(archive) as tar:
        # "data": no absolute paths, no links out of the folder, no device files. Members are
        # read one by one as they unpack, so a bomb stops at the budget, not at its end.
        tar.extractall(folder, members=_within(tar, archive.name, budget), filter="data")


def _within(tar: tarfile.TarFile, name: str, budget: _Budget) -> Iterator[tarfile.TarInfo]:
    files = size = 0
    for member in tar:
        files, size = files + 1, size + member.size
        budget.check(name, files, size)
        yield member


def fetch(uri: str, folder: Path, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> list[Path]:
    """Download `uri` into `folder` (see the module's layout); return the files written."""
    scheme = uri.partition("://")[0]
    if scheme not in SCHEMES:
        raise StorageError(f"{uri}: unsupported scheme {scheme!r}; use one of {SCHEMES}")
    fs, path = fsspec.core.url_to_fs(uri)
    folder.mkdir(parents=True, exist_ok=True)
    if _is_folder(fs, uri, path):
        base = path.rstrip("/") + "/"
        # Listed here rather than by fs.get(recursive=True), whose idea of where a folder's
        # own entry goes differs between stores (http lists it as a file).
        if scheme in ("http", "https"):
            remote = _http_files(fs, base)
        else:
            remote = [name for name in fs.find(base) if name.startswith(base) and name != base]
        if not remote:
            raise StorageError(f"{uri}: an empty folder")
        if len(remote) > MAX_FILES:
            raise StorageError(f"{uri}: more than {MAX_FILES} files")
        fs.get(remote, [str(_inside(folder, name[len(base) :], name)) for name in remote])
    elif is_archive(path):
        name = PurePosixPath(path).name
        with tempfile.TemporaryDirectory() as scratch:
            archive = Path(scratch) / name
            fs.get(path, str(archive))
            _unpack(archive, folder, max_unpacked_bytes)
    else:
        fs.get(path, str(_inside(folder, PurePosixPath(path).name, path)))
    return sorted(item for item in folder.rglob("*") if item.is_file())


@click.command()
@click.argument("uri")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--credentials",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder (a mounted Secret) whose files named like variables set them first.",
)
@click.option(
    "--max-unpacked-bytes",
    type=click.IntRange(min=1),
    default=MAX_UNPACKED_BYTES,
    show_default=True,
    help="The most an archive may unpack to (never more than FOLDER's free space).",
)
def main(uri: str, folder: Path, credentials: Path | None, max_unpacked_bytes: int) -> None:
    """Download URI (a file, a folder or an archive) into FOLDER."""
    try:
        if credentials is not None:
            click.echo(
                f"credentials from {credentials}: {', '.join(load_credentials(credentials))}"
            )
        files = fetch(uri, folder, max_unpacked_bytes)
    except Exception as error:
        # Any failure, whichever store library raised it, ends the init container with one
        # line that names the URI: the pod's termination message (FallbackToLogsOnError).
        raise click.ClickException(f"cannot fetch {uri}: {error}") from error
    size = sum(item.stat().st_size for item in files)
    click.echo(f"fetched {len(files)} file(s), {size} bytes, from {uri} into {folder}")
    if not files:
        raise click.ClickException(f"{uri} holds no files")


if __name__ == "__main__":
    main()
