"""image-classification serving a tiny random ViT from its folder, as it classifies in
process; images that are none, too large or cut short are refused alone."""

from __future__ import annotations

import asyncio
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from PIL import Image
from support.images import decoded, encoded
from support.in_process import classify_images
from support.model_server import http_get, post_batch, run_model_server
from support.tiny_models import LABELS, build_tiny_vit

from carpool.contract.wire import BYTES, ItemResult, Tensor
from carpool_model_server.handler import split_valid

RANDOM = np.random.default_rng(0)
# Mixed sizes, none the model's 32 x 32.
PIXELS = [
    RANDOM.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((40, 48), (64, 64), (20, 30))
]


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vit(tmp_path_factory.mktemp("vit"))


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height RGB pixels, followed by almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0"))


def image_item(data: bytes) -> dict[str, Tensor]:
    return {"image": Tensor(BYTES, (1,), [data])}


def by_label(result: ItemResult) -> dict[str, float]:
    assert result.outputs is not None, result.error
    labels = [label.decode() for label in result.outputs["labels"].data]  # type: ignore[union-attr]
    return dict(zip(labels, result.outputs["scores"].to_numpy().tolist(), strict=True))


def assert_as_in_process(results: list[ItemResult], expected: np.ndarray) -> None:
    for result, probabilities in zip(results, expected, strict=True):
        scores = by_label(result)
        assert list(scores.values()) == sorted(scores.values(), reverse=True)  # best first
        got = [scores[label] for label in LABELS]
        np.testing.assert_allclose(got, probabilities, atol=1e-5)


async def test_encoded_images_are_classified_and_bad_ones_refused_alone(
    vit: Path, tmp_path: Path
) -> None:
    files = [encoded(PIXELS[0], "PNG"), encoded(PIXELS[1], "JPEG"), encoded(PIXELS[2], "PNG")]
    images = [decoded(data) for data in files]
    expected = classify_images(vit, images)
    bad = [b"GIF89a not an image", png_header(40_000, 40_000), files[1][: len(files[1]) // 2]]
    items = [
        image_item(files[0]),
        *map(image_item, bad),
        image_item(files[1]),
        image_item(files[2]),
    ]
    args = ("--model-path", str(vit), "--device", "cpu", "--warmup-sizes", "1")
    with run_model_server(tmp_path, "image-classification", *args, timeout_s=120) as server:
        results = await post_batch(server, items)
        metadata = orjson.loads(http_get(server, "/metadata")[1])
    assert [r.status for r in results[1:4]] == [400, 400, 400]
    not_image, huge, truncated = (str(r.error) for r in results[1:4])
    assert "not a JPEG or PNG image" in not_image
    assert "1600000000 pixels" in huge, huge
    assert "JPEG image could not be decoded" in truncated and "truncated" in truncated
    assert_as_in_process([results[0], results[4], results[5]], expected)
    assert metadata["inputs"][0]["datatype"] == "BYTES"
    assert metadata["outputs"] == [
        {"name": "labels", "datatype": "BYTES", "shape": [3]},
        {"name": "scores", "datatype": "FP32", "shape": [3]},
    ]


async def test_uint8_pixels_of_any_size_are_classified(vit: Path, tmp_path: Path) -> None:
    expected = classify_images(vit, [Image.fromarray(pixels) for pixels in PIXELS])
    args = ("--model-path", str(vit), "--device", "cpu", "--warmup-sizes", "1")
    args += ("--handler-options", "input=uint8")
    with run_model_server(tmp_path, "image-classification", *args, timeout_s=120) as server:
        items = [{"image": Tensor.from_numpy(pixels)} for pixels in PIXELS]
        items.insert(1, {"image": Tensor.from_numpy(np.zeros((0, 5, 3), np.uint8))})
        results = await post_batch(server, items)
        metadata = orjson.loads(http_get(server, "/metadata")[1])
    assert results[1].status == 400 and "no pixels" in str(results[1].error)
    assert_as_in_process([results[0], *results[2:]], expected)
    (spec,) = metadata["inputs"]
    assert (spec["datatype"], spec["shape"]) == ("UINT8", [-1, -1, 3])


def test_prepared_fp32_pixels_go_to_the_model_as_they_are(vit: Path) -> None:
    from transformers import AutoModelForImageClassification

    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_image_classification import ImageClassificationHandler

    settings = HandlerSettings(vit, torch.float32, 4, {"input": "fp32"})
    handler = ImageClassificationHandler(settings)
    handler.load(torch.device("cpu"))
    assert [spec.shape for spec in handler.metadata.inputs] == [(3, 32, 32)]
    pixels = RANDOM.standard_normal((2, 3, 32, 32)).astype(np.float32)
    items = [
        {"image": Tensor.from_numpy(pixels[0])},
        {"image": Tensor.from_numpy(pixels[1, :, :16])},
    ]
    items.append({"image": Tensor.from_numpy(pixels[1])})
    with torch.inference_mode():
        prepared = handler.preprocess(items)
        assert prepared.batch is not None
        results = handler.postprocess(handler.infer(prepared.batch))
        model = AutoModelForImageClassification.from_pretrained(str(vit)).eval()
        expected = model(pixel_values=torch.from_numpy(pixels)).logits.softmax(-1).numpy()
    assert list(prepared.rejected) == [1] and "[3, 32, 32]" in prepared.rejected[1]
    for outputs, probabilities in zip(results, expected, strict=True):
        labels = [label.decode() for label in outputs["labels"].data]  # type: ignore[union-attr]
        scores = dict(zip(labels, outputs["scores"].to_numpy().tolist(), strict=True))
        np.testing.assert_allclose([scores[label] for label in LABELS], probabilities, atol=1e-5)


async def test_through_carpool_serve_a_bad_image_fails_its_request_alone(vit: Path) -> None:
    import aiohttp
    from support.oip import bytes_request
    from support.serve import serving

    from carpool.processes import free_port

    files = [encoded(PIXELS[0], "PNG"), encoded(PIXELS[1], "JPEG")]
    cut = files[1][: len(files[1]) // 2]
    expected = classify_images(vit, [decoded(data) for data in files])
    port = free_port()
    args = ["--handler", "image-classification", "--model-path", str(vit), "--port", str(port)]
    args += ["--grpc-port", "0", "--torch-threads", "1"]
    with serving(*args, until="ready at"):
        url = f"http://127.0.0.1:{port}/v2/models/image-classification/infer"
        async with aiohttp.ClientSession() as session:

            async def ask(data: bytes) -> tuple[int, dict[str, Any]]:
                body, headers = bytes_request("image", data)
                async with session.post(url, data=body, headers=headers) as reply:
                    return reply.status, orjson.loads(await reply.read())

            # Sent at once: the sidecar may batch them together; the bad one fails alone.
            answers = await asyncio.gather(ask(files[0]), ask(cut), ask(files[1]))
    (good, _), (bad_status, bad), (other, _) = answers
    assert (good, bad_status, other) == (200, 400, 200), answers
    assert "truncated" in bad["error"]
    for (_, document), probabilities in zip((answers[0], answers[2]), expected, strict=True):
        outputs = {output["name"]: output["data"] for output in document["outputs"]}
        scores = dict(zip(outputs["labels"], outputs["scores"], strict=True))
        np.testing.assert_allclose([scores[label] for label in LABELS], probabilities, atol=1e-5)


def test_long_thin_pixels_are_refused_alone_and_large_ones_shrunk(vit: Path) -> None:
    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_image_classification import ImageClassificationHandler

    handler = ImageClassificationHandler(HandlerSettings(vit, torch.float32, 4, {"input": "uint8"}))
    handler.load(torch.device("cpu"))
    thin = np.zeros((1, 4000, 3), np.uint8)
    large = np.full((640, 640, 3), 7, np.uint8)
    items = [{"image": Tensor.from_numpy(pixels)} for pixels in (PIXELS[0], thin, large)]
    images, rejected = split_valid(items, handler._pixels_of)
    assert list(rejected) == [1] and "4000x1 pixels" in rejected[1], rejected
    assert [image.size for image in images] == [(48, 40), (64, 64)]


def test_prepared_pixels_that_are_not_finite_are_refused_alone(vit: Path) -> None:
    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_image_classification import ImageClassificationHandler

    handler = ImageClassificationHandler(HandlerSettings(vit, torch.float32, 4, {"input": "fp32"}))
    handler.load(torch.device("cpu"))
    pixels = np.zeros((3, 3, 32, 32), np.float32)
    pixels[1, 0, 5, 5], pixels[2, 2, 0, 0] = np.nan, -np.inf
    items = [{"image": Tensor.from_numpy(image)} for image in pixels]
    prepared = handler.preprocess(items)
    assert prepared.accepted_count == 1
    assert "value nan is outside" in prepared.rejected[1], prepared.rejected
    assert "value -inf is outside" in prepared.rejected[2], prepared.rejected
