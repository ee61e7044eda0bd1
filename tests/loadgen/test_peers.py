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
import torch

from carpool import processes
from carpool_model_server.errors import ConfigError

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


def test_limit_prints_a_row_per_size_asked_for(bench: dict[str, ModuleType]) -> None:
    command = [sys.executable, str(BENCH_DIR / "limit.py"), "--handler", "toy"]
    command += ["--sizes", "3,1", "--max-batch-size", "4", "--repeats", "1", "--pool", "8"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=processes.environment()
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[0].isdigit()]
    assert [int(row[0]) for row in rows] == [1, 3]
    # items/s of the whole step, and of the forward pass alone: never slower than the whole.
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    # What the dispatch benches read of it: items/s by size.
    assert bench["servers"].limit_rates(done.stdout) == {1: float(rows[0][2]), 3: float(rows[1][2])}
    too_big = subprocess.run(
        [*command[:4], "--sizes", "8", "--max-batch-size", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        env=processes.environment(),
    )
    assert too_big.returncode != 0 and "above --max-batch-size" in too_big.stderr


def test_limit_runs_every_text_handler_on_the_loads_texts(bench: dict[str, ModuleType]) -> None:
    # The BERT-large-shaped encoder, shrunk: a text handler that is not text-embedding.
    limit = importlib.import_module("limit")
    model_setup = importlib.import_module("model_setup")
    handler, device = model_setup.build_handler(
        "large_encoder:LargeEncoderHandler", "cpu", "fp32", 8, [("layers", "1"), ("hidden", "64")]
    )
    handler.load(device)
    items = limit.sample_items(handler, 16, "mixed")
    texts = {item["text"].data[0] for item in items}
    assert len(texts) > 8  # the load's mix, not one warm-up text repeated
    # The encoder answers one embedding of its own width per text, the same on every build.
    again, _ = model_setup.build_handler(
        "large_encoder:LargeEncoderHandler", "cpu", "fp32", 8, [("layers", "1"), ("hidden", "64")]
    )
    again.load(device)
    with torch.inference_mode():
        [first, _], [same, _] = (
            encoder.postprocess(encoder.infer(encoder.preprocess(items[:2]).batch))
            for encoder in (handler, again)
        )
    assert first["embedding"].shape == (64,)
    assert same["embedding"].to_numpy().tolist() == first["embedding"].to_numpy().tolist()
    # A handler of floats is given its example item.
    toy, _ = model_setup.build_handler("toy", "cpu", "fp32", 8)
    assert limit.sample_items(toy, 3, "mixed") == [toy.example_item()] * 3


def test_every_variant_takes_the_dtype_and_refuses_what_the_model_server_refuses(
    bench: dict[str, ModuleType], tmp_path: Path
) -> None:
    servers = bench["servers"]
    settings = servers.ModelSettings("toy", "toy", "cpu", 1, 32, 5.0, dtype="fp16")
    variants = [servers.unbatched(settings), servers.carpool(settings)]
    variants += [peer.variant(settings) for peer in bench["peers"].PEERS.values()]
    for variant in variants:
        assert variant.command[variant.command.index("--dtype") + 1] == "fp16", variant.name
    assert "--dtype" in servers.limit_command(settings, "mixed")
    # fp16 on a CPU: the unbatched server and `carpool serve` refuse it as the model server
    # does, rather than serve fp32 beside an fp16 carpool.
    for variant in variants[:2]:
        log = tmp_path / f"{variant.name}.log"
        with (
            pytest.raises(RuntimeError, match="fp16 needs a CUDA device"),
            servers.started(variant, log, 60),
        ):
            pass
    peer_model = importlib.import_module("peer_model")
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        peer_model.load("toy", "cpu", 1, 32, "fp16")


def test_the_peers_rebuild_carpool_without_reaching_an_index(
    bench: dict[str, ModuleType], tmp_path: Path
) -> None:
    peers = bench["peers"]
    peer = peers.Peer("offline", ("nothing==0",), "offline_app.py", "/health")
    commands: list[list[str]] = []

    def run(command: list[str], check: bool) -> None:
        commands.append(command)
        if command[1:3] == ["-m", "venv"]:
            (Path(command[3]) / "bin").mkdir(parents=True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peers, "REPO_DIR", tmp_path)
        patch.setattr(peers.subprocess, "run", run)
        assert peers.python_for(peer, install=True) == peer.python
    installs = [command for command in commands if "install" in command]
    # The build backend goes in with the venv; the rebuild of carpool on every run uses it
    # instead of fetching one into an isolated build environment.
    assert any(spec in installs[1] for spec in peers.BUILD_BACKEND)
    assert "--no-build-isolation" in installs[-1] and "--no-deps" in installs[-1]


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
        loaded.append(peer_model.load(served.handler, "cpu", 1, served.max_batch_size, "fp32"))

    command = peer_model.serve_options(main)
    args = ["--handler", "image-classification", "--port", "1", "--model-path", str(vit)]
    command.main([*args, "--handler-options", "top_k=2,input=uint8"], standalone_mode=False)
    [handler] = loaded
    assert handler.settings.model_path == vit
    (image,) = handler.metadata.inputs
    assert image.datatype == "UINT8"
    assert [spec.shape for spec in handler.metadata.outputs] == [(2,), (2,)]
