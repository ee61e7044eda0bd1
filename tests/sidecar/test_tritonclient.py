"""Triton's own HTTP client against a real sidecar: what Triton users run unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.model_server import SUPPORT_DIR
from support.sidecar import Pair, run_pair

httpclient = pytest.importorskip("tritonclient.http")
triton_utils = pytest.importorskip("tritonclient.utils")

# Each batch takes 0.3 s, so a 50 ms client timeout runs out while its batch runs.
SLOW = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": "0.3"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp_path = tmp_path_factory.mktemp("triton")
    with run_pair(tmp_path, "model_handlers:SlowInferHandler", env=SLOW) as both:
        yield both


@pytest.fixture
def client(pair: Pair) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(pair.sidecar.url.removeprefix("http://"))
    yield triton
    triton.close()


def toy_input(rows: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    return tensor


ROWS = np.array([[1, 2, 3, 4], [0, 0, 0, 1]], dtype=np.float32)


def test_metadata_and_readiness(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("toy")
    metadata = client.get_model_metadata("toy")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]


@pytest.mark.parametrize("binary", [False, True])
def test_fp32_json_and_binary(client: httpclient.InferenceServerClient, binary: bool) -> None:
    output = httpclient.InferRequestedOutput("output", binary_data=binary)
    result = client.infer("toy", [toy_input(ROWS, binary)], outputs=[output])
    np.testing.assert_array_equal(result.as_numpy("output"), 2 * ROWS + 1)
    raw = result.get_output("output")
    assert ("data" in raw) is not binary


def test_without_requested_outputs_all_come_binary(
    client: httpclient.InferenceServerClient,
) -> None:
    # The client then sends the request-level `binary_data_output: true`.
    result = client.infer("toy", [toy_input(ROWS, False)])
    assert "data" not in result.get_output("output")
    np.testing.assert_array_equal(result.as_numpy("output"), 2 * ROWS + 1)


def test_client_timeout_in_microseconds_is_504(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(triton_utils.InferenceServerException) as failed:
        client.infer("toy", [toy_input(ROWS, True)], timeout=50_000)
    assert failed.value.status() == "504"
    # A generous timeout is not mistaken for milliseconds or seconds.
    result = client.infer("toy", [toy_input(ROWS, True)], timeout=20_000_000)
    np.testing.assert_array_equal(result.as_numpy("output"), 2 * ROWS + 1)


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_in_and_out(tmp_path: Path, binary: bool) -> None:
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    with run_pair(tmp_path, "shout_handler:ShoutHandler", env=env, model="shout") as pair:
        triton = httpclient.InferenceServerClient(pair.sidecar.url.removeprefix("http://"))
        try:
            texts = np.array([[b"carpool"], [b""], ["caf\u00e9".encode()]], dtype=object)
            tensor = httpclient.InferInput("text", [3, 1], "BYTES")
            tensor.set_data_from_numpy(texts, binary_data=binary)
            output = httpclient.InferRequestedOutput("shout", binary_data=binary)
            result = triton.infer("shout", [tensor], outputs=[output])
        finally:
            triton.close()
    shouted = result.as_numpy("shout")
    assert shouted.shape == (3, 1)
    # JSON output arrives as text, binary output as bytes.
    values = [
        value.encode() if isinstance(value, str) else bytes(value) for value in shouted.ravel()
    ]
    assert values == [b"CARPOOL", b"", "CAF\u00e9".encode()]
