"""`python -m carpool.storage`, the weights init container, against stores started here:
a local HTTP server and moto's S3 server. No request leaves 127.0.0.1."""

from __future__ import annotations

import functools
import gzip
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto.server import ThreadedMotoServer

from carpool import storage
from carpool.processes import free_port
from carpool.storage import MAX_FILES

WEIGHTS = bytes(range(256)) * 64
CONFIG = b'{"hidden_size": 384}\n'


def fetch(
    uri: str, folder: Path, *extra: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """The init container's command, as the operator renders it."""
    return subprocess.run(
        [sys.executable, "-m", "carpool.storage", uri, str(folder), *extra],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        # The sandbox's own AWS settings must not leak in: only --credentials counts.
        env={k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))},
    )


def files_in(folder: Path) -> dict[str, bytes]:
    return {
        item.relative_to(folder).as_posix(): item.read_bytes()
        for item in folder.rglob("*")
        if item.is_file()
    }


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a folder, with index pages for its folders."""
    root = tmp_path_factory.mktemp("site")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_file_keeps_its_name(site: tuple[str, Path], tmp_path: Path) -> None:
    url, root = site
    (root / "model.pt").write_bytes(WEIGHTS)
    done = fetch(f"{url}/model.pt", tmp_path / "models")
    assert done.returncode == 0, done.stderr
    assert files_in(tmp_path / "models") == {"model.pt": WEIGHTS}
    assert f"fetched 1 file(s), {len(WEIGHTS)} bytes" in done.stdout


def test_an_archive_is_unpacked(site: tuple[str, Path], tmp_path: Path) -> None:
    url, root = site
    (root / "bundle.tar.gz").write_bytes(
        tar_gz({"resnet/model.pt": WEIGHTS, "resnet/config.json": CONFIG})
    )
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("model.pt", WEIGHTS)
    (root / "bundle.zip").write_bytes(zipped.getvalue())

    assert fetch(f"{url}/bundle.tar.gz", tmp_path / "tar").returncode == 0
    assert files_in(tmp_path / "tar") == {"resnet/model.pt": WEIGHTS, "resnet/config.json": CONFIG}
    assert fetch(f"{url}/bundle.zip", tmp_path / "zip").returncode == 0
    assert files_in(tmp_path / "zip") == {"model.pt": WEIGHTS}


def test_a_folder_url_brings_its_files(site: tuple[str, Path], tmp_path: Path) -> None:
    url, root = site
    folder = root / "minilm"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "tokenizer" / "vocab.txt").write_bytes(b"[PAD]\n[CLS]\n")
    done = fetch(f"{url}/minilm/", tmp_path / "models")
    assert done.returncode == 0, done.stderr
    assert files_in(tmp_path / "models") == {
        "model.safetensors": WEIGHTS,
        "config.json": CONFIG,
        "tokenizer/vocab.txt": b"[PAD]\n[CLS]\n",
    }


def test_an_archive_cannot_write_outside_the_folder(site: tuple[str, Path], tmp_path: Path) -> None:
    url, root = site
    (root / "evil.tar.gz").write_bytes(tar_gz({"../escaped.txt": b"x", "model.pt": WEIGHTS}))
    done = fetch(f"{url}/evil.tar.gz", tmp_path / "models")
    assert done.returncode == 1
    assert "cannot fetch" in done.stderr
    assert not (tmp_path / "escaped.txt").exists()


def files_under(folder: Path) -> set[str]:
    return {item.relative_to(folder).as_posix() for item in folder.rglob("*") if item.is_file()}


def index_page(*links: str) -> bytes:
    return "".join(f'<a href="{link}">{link}</a>\n' for link in links).encode()


def test_an_index_page_cannot_send_files_outside_the_folder(
    site: tuple[str, Path], tmp_path: Path
) -> None:
    url, root = site
    (root / "escaped.txt").write_bytes(b"not a weight")
    (root / "sibling").mkdir()
    (root / "sibling" / "other.bin").write_bytes(b"not this folder's")
    folder = root / "hostile"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "sub" / "model.pt").write_bytes(WEIGHTS)
    (folder / "index.html").write_bytes(
        index_page(
            "config.json",
            "sub/model.pt",
            "../../escaped.txt",  # fsspec joins it to the folder's URL
            "../sibling/other.bin",
            "/escaped.txt",
            "%2e%2e/escaped.txt",
            "config.json?download=1",
            "./",  # itself: read once, not walked forever
            "../hostile/",
            "sub/../",
        )
    )
    target = tmp_path / "a" / "b" / "models"
    done = fetch(f"{url}/hostile/", target, timeout_s=30)
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path) == {"a/b/models/config.json", "a/b/models/sub/model.pt"}


def test_a_store_key_that_climbs_out_of_the_prefix_is_refused(s3: str, tmp_path: Path) -> None:
    secret = credentials(tmp_path / "secret", s3)
    done = fetch("s3://models/climb", tmp_path / "a" / "models", "--credentials", str(secret))
    assert done.returncode == 1
    assert "climb/../../x.pt" in done.stderr and "outside" in done.stderr
    assert files_under(tmp_path / "a") == set()
    assert not (tmp_path / "x.pt").exists()


def big_member_tar(declared: int) -> bytes:
    """A tar.gz whose one member's header declares `declared` bytes; only the header is sent,
    as a bomb's first bytes arrive."""
    info = tarfile.TarInfo("model.pt")
    info.size = declared
    return gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT))


def many_members_zip(count: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n in range(count):
            archive.writestr(f"shard-{n}", b"")
    return buffer.getvalue()


def test_an_archive_that_unpacks_past_its_bounds_is_refused(
    site: tuple[str, Path], tmp_path: Path
) -> None:
    url, root = site
    (root / "bomb.tar.gz").write_bytes(big_member_tar(1 << 40))  # 1 TiB
    started = time.monotonic()
    done = fetch(f"{url}/bomb.tar.gz", tmp_path / "bomb")
    assert time.monotonic() - started < 30
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "unpacks to more than" in done.stderr, done.stderr
    assert files_under(tmp_path / "bomb") == set()

    (root / "small.tar.gz").write_bytes(tar_gz({"model.pt": WEIGHTS}))
    done = fetch(f"{url}/small.tar.gz", tmp_path / "small", "--max-unpacked-bytes", "1000")
    assert done.returncode == 1 and "more than 1000 bytes" in done.stderr, done.stderr

    (root / "many.zip").write_bytes(many_members_zip(MAX_FILES + 1))
    done = fetch(f"{url}/many.zip", tmp_path / "many")
    assert done.returncode == 1 and f"more than {MAX_FILES} files" in done.stderr, done.stderr
    assert files_under(tmp_path / "many") == set()


def test_a_missing_file_fails_with_its_url(site: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = site
    done = fetch(f"{url}/absent.pt", tmp_path / "models")
    assert done.returncode == 1
    assert f"cannot fetch {url}/absent.pt" in done.stderr


def test_an_unknown_scheme_is_refused(tmp_path: Path) -> None:
    done = fetch("ftp://example.com/model.pt", tmp_path / "models")
    assert done.returncode == 1 and "unsupported scheme 'ftp'" in done.stderr


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1, with a bucket of weights."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="carpool",
            aws_secret_access_key="secret",
        )
        client.create_bucket(Bucket="models")
        client.put_object(Bucket="models", Key="resnet/v3/model.pt", Body=WEIGHTS)
        client.put_object(Bucket="models", Key="resnet/v3/config.json", Body=CONFIG)
        client.put_object(
            Bucket="models", Key="resnet/v3.tar.gz", Body=tar_gz({"model.pt": WEIGHTS})
        )
        client.put_object(Bucket="models", Key="climb/model.pt", Body=WEIGHTS)
        client.put_object(Bucket="models", Key="climb/../../x.pt", Body=WEIGHTS)
        yield endpoint
    finally:
        server.stop()


def credentials(folder: Path, endpoint: str) -> Path:
    """A mounted Secret as the kubelet lays it out: one file per key."""
    folder.mkdir()
    (folder / "AWS_ACCESS_KEY_ID").write_text("carpool")
    (folder / "AWS_SECRET_ACCESS_KEY").write_text("secret\n")
    (folder / "FSSPEC_S3_ENDPOINT_URL").write_text(endpoint)
    (folder / "ca.pem").write_text("not a variable: stays a file")
    return folder


def test_s3_prefix_and_archive_with_credentials_from_a_secret(s3: str, tmp_path: Path) -> None:
    secret = credentials(tmp_path / "secret", s3)
    done = fetch("s3://models/resnet/v3", tmp_path / "prefix", "--credentials", str(secret))
    assert done.returncode == 0, done.stderr
    assert files_in(tmp_path / "prefix") == {"model.pt": WEIGHTS, "config.json": CONFIG}
    assert "AWS_SECRET_ACCESS_KEY" in done.stdout and "secret\n" not in done.stdout

    done = fetch("s3://models/resnet/v3.tar.gz", tmp_path / "tar", "--credentials", str(secret))
    assert done.returncode == 0, done.stderr
    assert files_in(tmp_path / "tar") == {"model.pt": WEIGHTS}


def test_s3_with_half_the_credentials_fails_in_one_line(s3: str, tmp_path: Path) -> None:
    secret = credentials(tmp_path / "secret", s3)
    (secret / "AWS_SECRET_ACCESS_KEY").unlink()
    done = fetch(
        "s3://models/resnet/v3/model.pt", tmp_path / "models", "--credentials", str(secret)
    )
    assert done.returncode == 1
    assert "cannot fetch s3://models/resnet/v3/model.pt" in done.stderr
    assert "AWS_SECRET_ACCESS_KEY" in done.stderr and "Traceback" not in done.stderr


def test_an_archive_is_bounded_by_the_disks_free_space(
    site: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = site
    (root / "fits.tar.gz").write_bytes(tar_gz({"model.pt": WEIGHTS}))
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda _: SimpleNamespace(free=1000))
    with pytest.raises(storage.StorageError, match=r"more than 1000 bytes \(the free space of"):
        storage.fetch(f"{url}/fits.tar.gz", tmp_path / "models")
