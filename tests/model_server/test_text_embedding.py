"""The text-embedding handler (all-MiniLM-L6-v2) served by a real model server process."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from support.model_server import ModelServer, http_get, post_batch, run_model_server

from carpool.model_server.wire import BYTES, ItemResult, Tensor

SENTENCES = [
    "A cat sits on the mat.",
    "A kitten is sitting on a rug.",
    "Quarterly revenue grew by ten percent.",
    "The stock market closed higher after strong earnings.",
    "Un chat dort sur le canapé, très paisiblement, pendant tout l'après-midi.",
]


def text_item(text: str) -> dict[str, Tensor]:
    return {"text": Tensor(BYTES, (1,), [text.encode()])}


def embedding(result: ItemResult) -> npt.NDArray[np.float32]:
    assert result.error is None, result.error
    assert result.outputs is not None
    tensor = result.outputs["embedding"]
    assert (tensor.datatype, tensor.shape) == ("FP32", (384,))
    vector: npt.NDArray[np.float32] = tensor.to_numpy()
    return vector


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    with run_model_server(
        tmp_path_factory.mktemp("minilm"),
        "text-embedding",
        "--warmup-sizes",
        "1,2",
        "--device",
        "cpu",
        timeout_s=120,
    ) as running:
        yield running


async def test_embeddings_are_unit_vectors_and_deterministic(server: ModelServer) -> None:
    first = await post_batch(server, [text_item(s) for s in SENTENCES])
    again = await post_batch(server, [text_item(s) for s in SENTENCES])
    for one, two in zip(first, again, strict=True):
        assert np.linalg.norm(embedding(one)) == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_allclose(embedding(one), embedding(two), atol=1e-6)


async def test_similar_sentences_are_closer_than_unrelated_ones(server: ModelServer) -> None:
    cat, kitten, revenue, market, _ = (
        embedding(r) for r in await post_batch(server, [text_item(s) for s in SENTENCES])
    )
    assert cat @ kitten > cat @ revenue + 0.3
    assert revenue @ market > revenue @ kitten


async def test_batch_equals_one_by_one(server: ModelServer) -> None:
    # Padding to the longest item must not change the shorter items' embeddings.
    batched = [embedding(r) for r in await post_batch(server, [text_item(s) for s in SENTENCES])]
    for sentence, vector in zip(SENTENCES, batched, strict=True):
        alone = embedding((await post_batch(server, [text_item(sentence)]))[0])
        np.testing.assert_allclose(vector, alone, atol=1e-5)


async def test_bad_items_fail_alone(server: ModelServer) -> None:
    items = [
        text_item("fine"),
        {"text": Tensor(BYTES, (1,), [b"\xff\xfe not utf-8"])},
        {"text": Tensor(BYTES, (2,), [b"two", b"strings"])},
        {"text": Tensor.from_numpy(np.zeros(3, dtype=np.float32))},
        text_item(""),
    ]
    results = await post_batch(server, items)
    assert results[0].error is None and results[4].error is None
    assert [r.status for r in results[1:4]] == [400, 400, 400]
    assert "UTF-8" in str(results[1].error) and "one string" in str(results[2].error)


def test_metadata(server: ModelServer) -> None:
    metadata = orjson.loads(http_get(server, "/metadata")[1])
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [384]}]
