"""torch-export serving `.pt2` programs saved with torch.export.save; and image-classification
serving a folder whose classifier is one (a torchvision-shaped network, no transformers)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from PIL import Image
from support.model_server import http_get, post_batch, run_model_server
from support.tiny_models import TinyConvNet, export, tiny_conv_net

from carpool.contract.wire import BYTES, Tensor
from carpool_model_server.exported import load_exported


@pytest.fixture(scope="module")
def network() -> TinyConvNet:
    return tiny_conv_net()


async def test_a_program_answers_each_item_as_in_process(
    network: TinyConvNet, tmp_path: Path
) -> None:
    path = export(network, tmp_path / "net.pt2", torch.zeros(2, 3, 16, 16))
    inputs = [torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(n)) for n in range(3)]
    with torch.inference_mode():
        expected = network(torch.stack(inputs)).numpy()
    items = [{"input": Tensor.from_numpy(x.numpy())} for x in inputs]
    items.insert(1, {"input": Tensor.from_numpy(np.zeros((3, 8, 8), np.float32))})
    args = ("--model-path", str(path), "--warmup-sizes", "1,4", "--device", "cpu")
    with run_model_server(tmp_path, "torch-export", *args) as server:
        log_when_ready = server.log()
        results = await post_batch(server, items)
        metadata = orjson.loads(http_get(server, "/metadata")[1])
    assert results[1].status == 400 and "[3, 16, 16]" in str(results[1].error)
    answered = [r.outputs["output"].to_numpy() for r in (results[0], *results[2:]) if r.outputs]
    np.testing.assert_allclose(np.stack(answered), expected, atol=1e-5)
    # The program states its item shape: the metadata publishes it and warm-up runs it.
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [3, 16, 16]}]
    assert "warm-up at batch size 4 took" in log_when_ready, log_when_ready


def test_a_program_of_a_fixed_batch_is_refused_with_how_to_export_it(
    network: TinyConvNet, tmp_path: Path
) -> None:
    path = export(network, tmp_path / "fixed.pt2", torch.zeros(1, 3, 16, 16), batch=False)
    with pytest.raises(ValueError, match=r"batch of exactly 1.*Dim\('batch'\)"):
        load_exported(path, torch.device("cpu"), torch.float32)
    (tmp_path / "not.pt2").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a \.pt2 package"):
        load_exported(tmp_path / "not.pt2", torch.device("cpu"), torch.float32)


async def test_image_classification_serves_an_exported_torchvision_classifier(
    network: TinyConvNet, tmp_path: Path
) -> None:
    folder = tmp_path / "classifier"
    folder.mkdir()
    export(network, folder / "model.pt2", torch.zeros(2, 3, 224, 224))
    labels = ["tench", "goldfish", "shark", "hen"]
    (folder / "config.json").write_text(json.dumps({"id2label": dict(enumerate(labels))}))
    photo = np.random.default_rng(1).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format="PNG")
    # torchvision's ImageNet recipe, by hand: shorter side to 256, centre 224, normalised.
    resized = Image.fromarray(photo).resize((341, 256), Image.Resampling.BILINEAR)
    left, top = (341 - 224) // 2, (256 - 224) // 2
    crop = np.asarray(resized.crop((left, top, left + 224, top + 224)), np.float32) / 255
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    pixels = torch.from_numpy(((crop - mean) / std).transpose(2, 0, 1).astype(np.float32))
    with torch.inference_mode():
        expected = network(pixels[None]).softmax(-1)[0].numpy()
    args = ("--model-path", str(folder), "--warmup-sizes", "1", "--device", "cpu")
    with run_model_server(tmp_path, "image-classification", *args) as server:
        (result,) = await post_batch(server, [{"image": Tensor(BYTES, (1,), [buffer.getvalue()])}])
    assert result.outputs is not None, result.error
    names = [label.decode() for label in result.outputs["labels"].data]  # type: ignore[union-attr]
    scores = dict(zip(names, result.outputs["scores"].to_numpy(), strict=True))
    np.testing.assert_allclose([scores[label] for label in labels], expected, atol=1e-5)


def test_labels_that_do_not_match_the_program_s_classes_are_refused_at_load(
    network: TinyConvNet, tmp_path: Path
) -> None:
    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_image_classification import ImageClassificationHandler

    export(network, tmp_path / "model.pt2", torch.zeros(2, 3, 224, 224))
    # Three names for the network's four classes: every answer would fail, or misname.
    names = {"0": "cat", "1": "dog", "2": "eel"}
    (tmp_path / "config.json").write_text(json.dumps({"id2label": names}))
    handler = ImageClassificationHandler(HandlerSettings(tmp_path, torch.float32, 4))
    with pytest.raises(ValueError, match="names 3 labels; the model gives 4 scores"):
        handler.load(torch.device("cpu"))


def test_a_program_of_dynamic_sides_refuses_items_of_another_rank_or_channels(
    network: TinyConvNet, tmp_path: Path
) -> None:
    from carpool_model_server.handler import HandlerSettings
    from carpool_model_server.handler_image_classification import ImageClassificationHandler
    from carpool_model_server.handler_torch_export import TorchExportHandler

    side = torch.export.Dim("side", min=8, max=64)
    shapes = {"x": {0: torch.export.Dim("batch", max=64), 2: side, 3: side}}
    program = torch.export.export(network, (torch.zeros(2, 3, 16, 16),), dynamic_shapes=shapes)
    torch.export.save(program, str(tmp_path / "sides.pt2"))
    handler = TorchExportHandler(HandlerSettings(tmp_path / "sides.pt2", torch.float32, 4))
    handler.load(torch.device("cpu"))
    assert [spec.shape for spec in handler.metadata.inputs] == [(3, -1, -1)]
    shaped = [(4, 16, 16), (3, 16, 16), (16,), (3, 24, 24), (3, 100, 100)]
    items = [{"input": Tensor.from_numpy(np.zeros(shape, np.float32))} for shape in shaped]
    # Four channels first: the good item after it was refused as not of its shape.
    prepared = handler.preprocess(items)
    assert sorted(prepared.rejected) == [0, 2, 3, 4], prepared.rejected
    assert "must have shape [3, -1, -1]" in prepared.rejected[0]
    assert "dimension 1 of 100 is outside the program's range [8, 64]" in prepared.rejected[4]
    # Batches over the program's own largest would fail in it.
    larger = TorchExportHandler(HandlerSettings(tmp_path / "sides.pt2", torch.float32, 128))
    with pytest.raises(ValueError, match="exported for batches of at most 64"):
        larger.load(torch.device("cpu"))
    (tmp_path / "classifier").mkdir()
    (tmp_path / "classifier/model.pt2").write_bytes((tmp_path / "sides.pt2").read_bytes())
    classifier = ImageClassificationHandler(
        HandlerSettings(tmp_path / "classifier", torch.float32, 128)
    )
    with pytest.raises(ValueError, match="exported for batches of at most 64"):
        classifier.load(torch.device("cpu"))
