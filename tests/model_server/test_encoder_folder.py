"""text-embedding serving a user's encoder folder (`--model-path`), as the model computes in
process: a tiny random BERT, saved by sentence-transformers and as a plain transformers
folder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from support.in_process import hidden_states
from support.model_server import ModelServer, http_get, post_batch, run_model_server
from support.tiny_models import build_tiny_encoder

from carpool_model_server.handler_text_embedding import recipe
from carpool_model_server.text_batch import text_item

# Mixed lengths: one word, a sentence, and two past the model's 64 positions, which differ
# only after them (so they must embed alike).
TEXTS = [
    "cat",
    "A kitten is sitting on a rug in the afternoon sun.",
    "cat " * 70 + "dog",
    "cat " * 70 + "fish",
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_encoder(tmp_path_factory.mktemp("encoder"))


def served(results: list[object]) -> npt.NDArray[np.float32]:
    rows = []
    for result in results:
        assert getattr(result, "error", None) is None, result
        rows.append(result.outputs["embedding"].to_numpy())  # type: ignore[attr-defined]
    return np.stack(rows)


@contextmanager
def serve(folder: Path, tmp: Path, *options: str) -> Iterator[ModelServer]:
    args = ["--model-path", str(folder), "--device", "cpu", "--warmup-sizes", "1"]
    if options:
        args += ["--handler-options", ",".join(options)]
    with run_model_server(tmp, "text-embedding", *args, timeout_s=120) as server:
        yield server


@pytest.fixture(scope="module")
def sentence_folder(encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The encoder as sentence-transformers saves it: CLS pooling, then Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    modules = [models.Transformer(str(encoder)), models.Pooling(32, "cls"), models.Normalize()]
    folder = tmp_path_factory.mktemp("sentence")
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


async def test_a_sentence_transformers_folder_embeds_as_sentence_transformers_does(
    sentence_folder: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(sentence_folder), device="cpu").encode(TEXTS)
    with serve(sentence_folder, tmp_path) as server:
        vectors = served(await post_batch(server, [text_item(text) for text in TEXTS]))
        metadata = orjson.loads(http_get(server, "/metadata")[1])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(vectors[2], vectors[3], atol=1e-6)  # cut at 64 tokens
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [32]}]


async def test_a_plain_folder_takes_the_pooling_it_is_given(encoder: Path, tmp_path: Path) -> None:
    expected = [states[-1] for states in hidden_states(encoder, TEXTS)]
    with serve(encoder, tmp_path, "pooling=last", "normalize=false") as server:
        vectors = served(await post_batch(server, [text_item(text) for text in TEXTS]))
    np.testing.assert_allclose(vectors, np.stack(expected), atol=1e-5)
    assert abs(np.linalg.norm(vectors[0]) - 1) > 0.01  # not normalised, as asked


def test_a_folder_with_modules_it_cannot_compute_is_refused(encoder: Path, tmp_path: Path) -> None:
    (tmp_path / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    pooling = {"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}
    (tmp_path / "1_Pooling/config.json").write_text(json.dumps(pooling))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        recipe(tmp_path)
    (tmp_path / "1_Pooling/config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules.append({"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="Dense"):
        recipe(tmp_path)
    # The server says so and exits, rather than serve embeddings the model never gives.
    args = ("--model-path", str(tmp_path), "--device", "cpu")
    with run_model_server(tmp_path, "text-embedding", *args, wait_ready=False) as server:
        assert server.process.wait(60) != 0
        assert "sentence_transformers.models.Dense" in server.log(), server.log()


@pytest.mark.parametrize("outside", ["../elsewhere", "/etc", "inner/../../elsewhere"])
def test_a_module_path_outside_the_folder_is_refused(tmp_path: Path, outside: str) -> None:
    (tmp_path / "model").mkdir()
    modules = [{"path": outside, "type": "sentence_transformers.models.Transformer"}]
    (tmp_path / "model/modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=f"module path '{outside}' leads out of"):
        recipe(tmp_path / "model")


def test_a_modules_file_that_is_no_list_of_objects_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text(json.dumps({"path": ""}))
    with pytest.raises(ValueError, match="not a list of modules"):
        recipe(tmp_path)
