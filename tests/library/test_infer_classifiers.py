"""`carpool infer` over JSON lines of image files and of texts, with the classifiers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from PIL import Image
from support.tiny_models import LABELS, build_tiny_classifier, build_tiny_vit


def infer(folder: Path, handler: str, model: Path, *extra: str) -> list[dict[str, Any]]:
    """Run `carpool infer` on folder/in.jsonl as a user would: its answer lines, in order."""
    args = ["--handler", handler, "--model-path", str(model), "--torch-threads", "1", *extra]
    args += ["--input", str(folder / "in.jsonl"), "--output", str(folder / "out.jsonl")]
    done = subprocess.run(
        [sys.executable, "-m", "carpool", "infer", *args],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _, *lines = (folder / "out.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def write_lines(path: Path, records: list[Any]) -> None:
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))


def test_a_file_of_image_paths_is_classified_in_order(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    vit = build_tiny_vit(tmp_path_factory.mktemp("vit"))
    folder = tmp_path_factory.mktemp("images")
    (folder / "img").mkdir()
    rng = np.random.default_rng(2)
    images = [
        Image.fromarray(rng.integers(0, 256, (24 + 8 * n, 40, 3), np.uint8)) for n in range(4)
    ]
    for n, image in enumerate(images):
        image.save(folder / "img" / f"{n}.png")
    records: list[Any] = [{"id": n, "image": {"file": f"img/{n}.png"}} for n in range(4)]
    records.insert(2, {"id": "gone", "image": {"file": "img/missing.png"}})
    (folder / "img/notes.txt").write_text("not an image")
    records.append({"id": "text", "image": {"file": "img/notes.txt"}})
    write_lines(folder / "in.jsonl", records)

    answers = infer(folder, "image-classification", vit, "--handler-options", "top_k=1")

    processor = AutoImageProcessor.from_pretrained(str(vit))
    model = AutoModelForImageClassification.from_pretrained(str(vit)).eval()
    with torch.inference_mode():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        probabilities = model(pixel_values=pixels).logits.softmax(-1).numpy()
    served = [answers[n] for n in (0, 1, 3, 4)]
    for answer, expected in zip(served, probabilities, strict=True):
        assert answer["outputs"]["labels"] == LABELS[int(expected.argmax())]
        assert answer["outputs"]["scores"] == pytest.approx([float(expected.max())], abs=1e-5)
    assert answers[2]["status"] == 400 and "cannot read img/missing.png" in answers[2]["error"]
    assert answers[5]["status"] == 400 and "not a JPEG or PNG image" in answers[5]["error"]


def test_a_file_of_texts_is_classified_in_order(tmp_path_factory: pytest.TempPathFactory) -> None:
    classifier = build_tiny_classifier(tmp_path_factory.mktemp("classifier"))
    folder = tmp_path_factory.mktemp("texts")
    texts = ["short", "a somewhat longer text to classify, with more words in it", "mid length"]
    write_lines(folder / "in.jsonl", texts)
    answers = infer(folder, "text-classification", classifier)
    assert [answer["index"] for answer in answers] == [0, 1, 2]
    for answer in answers:
        outputs = answer["outputs"]
        assert sorted(outputs["labels"]) == sorted(LABELS)  # every label, best first
        assert outputs["scores"] == sorted(outputs["scores"], reverse=True)
        assert sum(outputs["scores"]) == pytest.approx(1.0, abs=1e-5)
