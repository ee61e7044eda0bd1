"""The built-in handlers for a user's model, each served through `carpool serve` as a user
runs it: the metadata names the model's inputs and outputs, and requests of mixed lengths or
sizes sent at once share a batch and are answered as the model answers in process."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import torch
from support.images import decoded, encoded
from support.in_process import Floats, classify_images, classify_texts, hidden_states
from support.oip import bytes_request, json_request
from support.serve import serving
from support.sidecar import served_metric
from support.tiny_models import (
    LABELS,
    build_tiny_classifier,
    build_tiny_encoder,
    build_tiny_vit,
    export,
    tiny_conv_net,
)

from carpool.processes import free_port

Request = tuple[bytes, dict[str, str]]
Outputs = dict[str, list[Any]]  # a reply's outputs, data by name

# Mixed lengths: a word, a sentence, and one past the tiny models' 64 positions.
TEXTS = ["cat", "A kitten is sitting on a rug in the afternoon sun.", "word " * 90, "dog"]
RANDOM = np.random.default_rng(0)
# Mixed sizes, none the tiny ViT's 32 x 32.
PIXELS = [RANDOM.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((40, 48), (64, 64))]
IMAGES = [encoded(PIXELS[0], "PNG"), encoded(PIXELS[1], "JPEG"), encoded(PIXELS[0], "JPEG")]
# A long window, fixed: requests sent at once wait for each other in the queue.
BATCHING = ("--dispatch", "fixed", "--max-wait-ms", "300", "--max-batch-size", "8")


@dataclass(frozen=True)
class Case:
    """A tiny model in its folder or file, what to send it, and what it must answer."""

    model_path: Path
    requests: list[Request]
    expected: Floats  # one row per request
    answer: Callable[[Outputs], list[float]]  # a reply as a row of `expected`
    inputs: list[dict[str, Any]]  # the metadata's
    outputs: list[dict[str, Any]]


def by_label(outputs: Outputs) -> list[float]:
    scores = dict(zip(outputs["labels"], outputs["scores"], strict=True))
    return [scores[label] for label in LABELS]


def text_request(text: str) -> Request:
    return json_request("text", "BYTES", [1, 1], [text])


TEXT_INPUT = {"name": "text", "datatype": "BYTES", "shape": [-1, 1]}
RANKED = [
    {"name": "labels", "datatype": "BYTES", "shape": [-1, len(LABELS)]},
    {"name": "scores", "datatype": "FP32", "shape": [-1, len(LABELS)]},
]


def text_embedding(folder: Path) -> Case:
    """A plain encoder folder: the attention-masked mean, normalised."""
    build_tiny_encoder(folder)
    means = np.stack([states.mean(0) for states in hidden_states(folder, TEXTS)])
    expected = means / np.linalg.norm(means, axis=1, keepdims=True)
    embedding = [{"name": "embedding", "datatype": "FP32", "shape": [-1, 32]}]
    requests = list(map(text_request, TEXTS))
    return Case(folder, requests, expected, lambda o: o["embedding"], [TEXT_INPUT], embedding)


def text_classification(folder: Path) -> Case:
    build_tiny_classifier(folder)
    expected = classify_texts(folder, TEXTS)
    return Case(folder, list(map(text_request, TEXTS)), expected, by_label, [TEXT_INPUT], RANKED)


def image_classification(folder: Path) -> Case:
    build_tiny_vit(folder)
    expected = classify_images(folder, [decoded(data) for data in IMAGES])
    requests = [bytes_request("image", data) for data in IMAGES]
    image = {"name": "image", "datatype": "BYTES", "shape": [-1, 1]}
    return Case(folder, requests, expected, by_label, [image], RANKED)


def torch_export(folder: Path) -> Case:
    network = tiny_conv_net()
    path = export(network, folder / "net.pt2", torch.zeros(2, 3, 16, 16))
    pixels = torch.from_numpy(RANDOM.standard_normal((4, 3, 16, 16), dtype=np.float32))
    with torch.inference_mode():
        expected = network(pixels).numpy()
    requests = [json_request("input", "FP32", [1, 3, 16, 16], x.flatten().tolist()) for x in pixels]
    inputs = [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    outputs = [{"name": "output", "datatype": "FP32", "shape": [-1, -1]}]
    return Case(path, requests, expected, lambda o: o["output"], inputs, outputs)


CASES = {
    "text-embedding": text_embedding,
    "text-classification": text_classification,
    "image-classification": image_classification,
    "torch-export": torch_export,
}


@dataclass(frozen=True)
class Served:
    handler: str
    case: Case
    url: str  # the sidecar's

    def metric(self, name: str) -> float:
        return served_metric(self.url, self.handler, name)


@pytest.fixture(scope="module", params=list(CASES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    handler: str = request.param
    case = CASES[handler](tmp_path_factory.mktemp(handler))
    port = free_port()
    args = ["--handler", handler, "--model-path", str(case.model_path), "--device", "cpu"]
    args += ["--port", str(port), "--grpc-port", "0", "--torch-threads", "1", *BATCHING]
    with serving(*args, until="ready at") as process:
        assert process.poll() is None, f"carpool serve --handler {handler} exited"
        yield Served(handler, case, f"http://127.0.0.1:{port}")


def test_the_metadata_names_the_models_inputs_and_outputs(served: Served) -> None:
    with urllib.request.urlopen(f"{served.url}/v2/models/{served.handler}", timeout=10) as reply:
        metadata = orjson.loads(reply.read())
    assert metadata["name"] == served.handler
    assert metadata["inputs"] == served.case.inputs
    assert metadata["outputs"] == served.case.outputs


async def test_requests_sent_at_once_share_a_batch_and_answer_as_in_process(
    served: Served,
) -> None:
    case = served.case
    url = f"{served.url}/v2/models/{served.handler}/infer"
    batches, items = (served.metric(f"carpool_batch_size_{part}") for part in ("count", "sum"))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def ask(request: Request) -> tuple[int, Any]:
            body, headers = request
            async with session.post(url, data=body, headers=headers) as reply:
                return reply.status, orjson.loads(await reply.read())

        replies = await asyncio.gather(*map(ask, case.requests))
    assert [status for status, _ in replies] == [200] * len(replies), replies
    answers = []
    for _, document in replies:
        outputs = {output["name"]: output["data"] for output in document["outputs"]}
        answers.append(case.answer(outputs))
    np.testing.assert_allclose(np.array(answers), case.expected, atol=1e-5)
    batched = served.metric("carpool_batch_size_count") - batches
    assert served.metric("carpool_batch_size_sum") - items == len(replies)
    assert batched < len(replies), f"{len(replies)} requests went in {batched} batches"
