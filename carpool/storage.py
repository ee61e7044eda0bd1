"""`python -m carpool.storage URI FOLDER`: put a model's weights in a folder before it starts.

The init container of a BatchedModel with `spec.model.weights.storageUri` runs this. fsspec
does the transfers, so every store it knows works the same way: s3:// (s3fs), gs:// (gcsfs),
hf:// (huggingface_hub's HfFileSystem, `hf://org/repo@revision/sub/folder`), http(s)://.

Layout in FOLDER:
- a folder (a bucket prefix, a Hugging Face repository or an http(s) URL ending in `/`, read
  from its index page's links): its files, with their relative paths;
- an archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .zip): its unpacked contents;
- any other file: that file, under its own name.

Credentials come from the environment (the pod fills it from a Secret): AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and FSSPEC_S3_ENDPOINT_URL for S3-compatible stores;
GOOGLE_APPLICATION_CREDENTIALS for GCS; HF_TOKEN for gated Hugging Face repositories.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath

import click
import fsspec

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
SCHEMES = ("s3", "gs", "hf", "http", "https")


class StorageError(Exception):
    """A URI that cannot be fetched; the message says which and why."""


def is_archive(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


def _is_folder(fs: fsspec.AbstractFileSystem, uri: str, path: str) -> bool:
    # An http "folder" is an index page; asking whether a URL is one would download it, which
    # for a weights file means gigabytes. The trailing slash decides instead.
    if uri.startswith(("http://", "https://")):
        return uri.endswith("/")
    return bool(fs.isdir(path))


def fetch(uri: str, folder: Path) -> list[Path]:
    """Download `uri` into `folder` (see the module's layout); return the files written."""
    scheme = uri.partition("://")[0]
    if scheme not in SCHEMES:
        raise StorageError(f"{uri}: unsupported scheme {scheme!r}; use one of {SCHEMES}")
    fs, path = fsspec.core.url_to_fs(uri)
    folder.mkdir(parents=True, exist_ok=True)
    if _is_folder(fs, uri, path):
        # The trailing slash on the source copies the folder's contents, not the folder.
        fs.get(path.rstrip("/") + "/", str(folder) + "/", recursive=True)
    elif is_archive(path):
        name = PurePosixPath(path).name
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / name
            fs.get(path, str(local))
            # "data": no absolute paths, no links out of the folder, no device files.
            shutil.unpack_archive(local, folder, filter="data")
    else:
        fs.get(path, str(folder / PurePosixPath(path).name))
    return sorted(item for item in folder.rglob("*") if item.is_file())


@click.command()
@click.argument("uri")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def main(uri: str, folder: Path) -> None:
    """Download URI (a file, a folder or an archive) into FOLDER."""
    try:
        files = fetch(uri, folder)
    except (StorageError, OSError, ValueError, ImportError) as error:
        # FileNotFoundError, PermissionError and the stores' own errors are OSErrors.
        raise click.ClickException(f"cannot fetch {uri}: {error}") from error
    size = sum(item.stat().st_size for item in files)
    click.echo(f"fetched {len(files)} file(s), {size} bytes, from {uri} into {folder}")
    if not files:
        raise click.ClickException(f"{uri} holds no files")


if __name__ == "__main__":
    main()
