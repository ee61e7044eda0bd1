"""`python -m carpool.storage URI FOLDER`: put a model's weights in a folder before it starts.

The init container of a BatchedModel with `spec.model.weights.storageUri` runs this. fsspec
does the transfers, so every store it knows works the same way: s3:// (s3fs), gs:// (gcsfs),
hf:// (huggingface_hub's HfFileSystem, `hf://org/repo@revision/sub/folder`), http(s)://.

Layout in FOLDER:
- a folder (a bucket prefix, a Hugging Face repository or an http(s) URL ending in `/`, read
  from its index page's links): its files, with their relative paths;
- an archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .zip): its unpacked contents;
- any other file: that file, under its own name.

Credentials are what each store's library reads from the environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and FSSPEC_S3_ENDPOINT_URL for S3-compatible stores;
GOOGLE_APPLICATION_CREDENTIALS (a file) for GCS; HF_TOKEN for gated Hugging Face repositories.
With --credentials, the files of a mounted Secret named like variables set them, so that the
secrets stay out of the pod's spec and out of every other process.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import click
import fsspec
import fsspec.config

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
SCHEMES = ("s3", "gs", "hf", "http", "https")
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


def _unpack(archive: Path, folder: Path) -> None:
    if archive.name.lower().endswith(".zip"):
        # shutil's zip unpacker skips absolute and ".." members by itself (and takes no filter).
        shutil.unpack_archive(archive, folder)
    else:
        # "data": no absolute paths, no links out of the folder, no device files.
        shutil.unpack_archive(archive, folder, filter="data")


def fetch(uri: str, folder: Path) -> list[Path]:
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
        remote = [name for name in fs.find(base) if name.startswith(base) and name != base]
        if not remote:
            raise StorageError(f"{uri}: an empty folder")
        fs.get(remote, [str(folder / name[len(base) :]) for name in remote])
    elif is_archive(path):
        name = PurePosixPath(path).name
        with tempfile.TemporaryDirectory() as scratch:
            archive = Path(scratch) / name
            fs.get(path, str(archive))
            _unpack(archive, folder)
    else:
        fs.get(path, str(folder / PurePosixPath(path).name))
    return sorted(item for item in folder.rglob("*") if item.is_file())


@click.command()
@click.argument("uri")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--credentials",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder (a mounted Secret) whose files named like variables set them first.",
)
def main(uri: str, folder: Path, credentials: Path | None) -> None:
    """Download URI (a file, a folder or an archive) into FOLDER."""
    try:
        if credentials is not None:
            click.echo(
                f"credentials from {credentials}: {', '.join(load_credentials(credentials))}"
            )
        files = fetch(uri, folder)
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
