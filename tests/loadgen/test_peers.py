"""The peers of bench/compare.py: skipped cleanly when absent, serving carpool's model when
built, and the in-process limit at the batch sizes asked for."""

from __future__ import annotations

import importlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from carpool import processes

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    # The bench scripts import each other as top-level modules, as `python bench/x.py` runs.
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield {name: importlib.import_module(name) for name in ("peers", "servers", "compare")}
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_a_peer_without_its_venv_is_skipped_not_built(
    bench: dict[str, ModuleType], tmp_path: Path
) -> None:
    peers = bench["peers"]
    absent = peers.Peer("absent", ("nothing==0",), "absent_app.py", "/health")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peers, "REPO_DIR", tmp_path)
        assert peers.python_for(absent, install=False) is None
        # A venv whose build stopped halfway (no stamp) is not taken for a built one.
        (absent.venv / "bin").mkdir(parents=True)
        (absent.venv / "bin" / "python").symlink_to(sys.executable)
        assert peers.python_for(absent, install=False) is None


def test_compare_names_a_missing_peer_and_runs_without_it(
    bench: dict[str, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    compare, peers, servers = bench["compare"], bench["peers"], bench["servers"]
    settings = servers.ModelSettings("text-embedding", "text-embedding", "cpu", 1, 32, 5.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peers, "python_for", lambda peer, install: None)
        assert compare._peer_variants(("litserve", "bentoml"), False, settings) == []
    err = capsys.readouterr().err
    assert "litserve: skipped, not installed in" in err and "--install-peers" in err
    assert "bentoml: skipped" in err


def test_the_limit_is_measured_at_every_batch_the_clients_can_form(
    bench: dict[str, ModuleType],
) -> None:
    sizes = bench["compare"]._limit_sizes((1, 8, 12, 64), 32)
    # Powers of two for the best size, 12 for 12 clients, 32 (the max) for 64.
    assert sizes == (1, 2, 4, 8, 12, 16, 32)


def test_limit_prints_a_row_per_size_asked_for() -> None:
    command = [sys.executable, str(BENCH_DIR / "limit.py"), "--handler", "toy"]
    command += ["--sizes", "3,1", "--max-batch-size", "4", "--repeats", "1", "--pool", "8"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=processes.environment()
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[0].isdigit()]
    assert [int(row[0]) for row in rows] == [1, 3]
    assert all(float(row[2]) > 0 for row in rows)
    too_big = subprocess.run(
        [*command[:4], "--sizes", "8", "--max-batch-size", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        env=processes.environment(),
    )
    assert too_big.returncode != 0 and "above --max-batch-size" in too_big.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ray", "litserve", "mlserver", "bentoml"])
def test_each_peer_serves_the_embedding_that_carpool_serves(
    bench: dict[str, ModuleType], name: str, tmp_path: Path
) -> None:
    peers, servers = bench["peers"], bench["servers"]
    peer = peers.PEERS[name]
    if peers.python_for(peer, install=False) is None:
        pytest.skip(f"{name} is not installed in {peer.venv} (compare.py --install-peers)")
    settings = servers.ModelSettings("text-embedding", "text-embedding", "cpu", 1, 32, 5.0)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
    with servers.started(peer.variant(settings), tmp_path / "peer.log", 170) as server:
        request = urllib.request.Request(
            f"{server.url}/v2/models/text-embedding/infer",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            document = orjson.loads(answer.read())
    [output] = _outputs(document)
    # all-MiniLM-L6-v2: one 384-dimensional embedding for the one text sent.
    assert output["shape"] == [1, 384]
    assert len(output["data"]) == 384


def _outputs(document: Any) -> list[dict[str, Any]]:
    """The output tensors; BentoML answers the response object in a list of one."""
    if isinstance(document, list):
        [document] = document
    outputs: list[dict[str, Any]] = document["outputs"]
    return outputs


def test_every_peer_app_loads_the_model_path_and_options_it_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The options reach the handler in whichever process the peer runs it, through the
    # environment that serve_options sets (bench/peer_model.py).
    from support.tiny_models import build_tiny_vit

    sys.path.insert(0, str(BENCH_DIR))
    try:
        peer_model = importlib.import_module("peer_model")
    finally:
        sys.path.remove(str(BENCH_DIR))
    for variable in (peer_model.MODEL_PATH_ENV, peer_model.OPTIONS_ENV):
        monkeypatch.setenv(variable, "")  # restored when the test ends
    vit = build_tiny_vit(tmp_path / "vit")
    loaded = []

    def main(served: Any) -> None:
        loaded.append(peer_model.load(served.handler, "cpu", 1, served.max_batch_size))

    command = peer_model.serve_options(main)
    args = ["--handler", "image-classification", "--port", "1", "--model-path", str(vit)]
    command.main([*args, "--handler-options", "top_k=2,input=uint8"], standalone_mode=False)
    [handler] = loaded
    assert handler.settings.model_path == vit
    (image,) = handler.metadata.inputs
    assert image.datatype == "UINT8"
    assert [spec.shape for spec in handler.metadata.outputs] == [(2,), (2,)]
