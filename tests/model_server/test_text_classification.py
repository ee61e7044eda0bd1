"""text-classification serving a tiny random BERT classifier from its folder, as it
classifies in process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from support.in_process import classify_texts
from support.model_server import http_get, post_batch, run_model_server
from support.tiny_models import LABELS, build_tiny_classifier

from carpool.contract.wire import BYTES, Tensor
from carpool_model_server.text_batch import MAX_TEXT_BYTES, text_item

TEXTS = ["great", "The film was long, slow and rather dull in places.", "word " * 90]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_classifier(tmp_path_factory.mktemp("classifier"))


async def test_labels_and_scores_as_the_model_gives_them(classifier: Path, tmp_path: Path) -> None:
    expected = [dict(zip(LABELS, row, strict=True)) for row in classify_texts(classifier, TEXTS)]
    items = [text_item(TEXTS[0]), {"text": Tensor(BYTES, (1,), [b"x" * (MAX_TEXT_BYTES + 1)])}]
    items += [text_item(text) for text in TEXTS[1:]] + [{"text": Tensor(BYTES, (1,), [b"\xff"])}]
    args = ("--model-path", str(classifier), "--device", "cpu", "--warmup-sizes", "1")
    args += ("--handler-options", "top_k=2")
    with run_model_server(tmp_path, "text-classification", *args, timeout_s=120) as server:
        results = await post_batch(server, items)
        metadata = orjson.loads(http_get(server, "/metadata")[1])
    assert [r.status for r in results[1::3]] == [400, 400]
    assert "max_element_bytes" in str(results[1].error) and "UTF-8" in str(results[4].error)
    answered = [results[0], results[2], results[3]]
    for result, scores in zip(answered, expected, strict=True):
        assert result.outputs is not None, result.error
        labels = [label.decode() for label in result.outputs["labels"].data]  # type: ignore[union-attr]
        best = sorted(scores, key=lambda label: -scores[label])[:2]
        assert labels == best
        got = result.outputs["scores"].to_numpy()
        np.testing.assert_allclose(got, [scores[label] for label in best], atol=1e-5)
    assert metadata["outputs"] == [
        {"name": "labels", "datatype": "BYTES", "shape": [2]},
        {"name": "scores", "datatype": "FP32", "shape": [2]},
    ]
