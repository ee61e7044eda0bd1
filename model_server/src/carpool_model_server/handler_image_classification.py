"""`image-classification`: an image classifier in the folder `--model-path` names, offline.

The folder holds a Hugging Face image classifier (`config.json` and weights, loaded with
`AutoModelForImageClassification`), or a `torch.export` program as `model.pt2` (a
torchvision classifier exported as the `torch-export` handler takes it, see
`handler_torch_export`) with, optionally, a `config.json` whose `id2label` names its
classes (else they are numbered). Images are prepared as the folder's
`preprocessor_config.json` says (transformers' `AutoImageProcessor`), else as torchvision's
ImageNet classifiers were trained: shorter side to 256, centre crop 224, ImageNet mean and
deviation.

`--handler-options input=` chooses what each item's `image` carries:
- `encoded` (the default): BYTES [1], one JPEG or PNG file, decoded by `image_decode`
  (bounded before it is decoded; a file that is no such image, too large, truncated or
  corrupt is refused with 400 naming why);
- `uint8`: UINT8 [height, width, 3], RGB pixels, resized and normalised like decoded ones;
- `fp32`: FP32 [3, H, W], pixels already prepared as the model takes them (finite).
Each answer is the model's labels and scores, best first (`ranking`; `top_k=N`).
The items of a batch are prepared in one call of the processor, then moved to the device
at once.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.device import to_device
from carpool_model_server.errors import InvalidItem
from carpool_model_server.exported import EXPORTED_FILE, check_max_batch, load_exported
from carpool_model_server.folder import read_json
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Prepared,
    require_input,
    split_valid,
)
from carpool_model_server.handler_options import choice_option, positive_option
from carpool_model_server.image_decode import (
    MAX_IMAGE_BYTES,
    MAX_PIXELS,
    check_size,
    decode,
    fit,
    from_pixels,
)
from carpool_model_server.ranking import LABELS, SCORES, Ranked, Ranking

INPUTS = ("encoded", "uint8", "fp32")
# Each image is resized to the model's size in preprocess: its file or pixel count is no
# measure of what it costs the model, so images of any size share a batch.
ENCODED = TensorSpec("image", BYTES, (1,), max_element_bytes=MAX_IMAGE_BYTES, batch_by_length=False)
PIXELS = TensorSpec(
    "image", "UINT8", (-1, -1, 3), max_elements=MAX_PIXELS * 3, batch_by_length=False
)
# torchvision's ImageNet classifiers' preprocessing, for a folder that states none.
IMAGENET: dict[str, Any] = {
    "size": {"shortest_edge": 256},
    "crop_size": {"height": 224, "width": 224},
    "resample": 2,  # bilinear, as torchvision resizes
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


class ImageClassificationHandler(Handler[torch.Tensor, Ranked]):
    preprocess_overlaps_infer = True  # the processor serves preprocess alone
    metadata = Metadata(platform="pytorch_vision", inputs=(ENCODED,), outputs=(LABELS, SCORES))
    options = frozenset({"input", "top_k"})

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.input = choice_option(settings.options, "input", INPUTS) or "encoded"
        self._top_k = positive_option(settings.options, "top_k")
        if self.input == "uint8":
            # Pixels of any size are resized into one batch.
            self.metadata = Metadata(
                self.metadata.platform, (PIXELS,), self.metadata.outputs, pads_variable_dims=True
            )

    def load(self, device: torch.device) -> None:
        from transformers import AutoImageProcessor, BitImageProcessor

        path = self.settings.model_path
        if path is None:
            raise ValueError("the image-classification handler needs --model-path")
        self.device = device
        if (path / "preprocessor_config.json").is_file():
            self.processor: Any = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
                str(path), local_files_only=True
            )
        else:
            self.processor = BitImageProcessor(**IMAGENET)
        probe = self.processor(images=[from_pixels(np.zeros((8, 8, 3), np.uint8))])
        self.size = tuple(int(n) for n in np.asarray(probe["pixel_values"]).shape[1:])
        self.model, config = _network(path, device, self.settings)
        zeros = torch.zeros((1, *self.size), device=device, dtype=self.settings.dtype)
        with torch.inference_mode():
            classes = self.model(zeros).shape[-1]
        # An exported classifier's config.json is written apart from it: its names must
        # match the scores, or every answer would fail or misname. Without names, numbers.
        id2label = config.get("id2label") or dict(enumerate(map(str, range(classes))))
        if len(id2label) != classes:
            raise ValueError(
                f"{path / 'config.json'} id2label names {len(id2label)} labels; the model "
                f"gives {classes} scores"
            )
        self.ranking = Ranking.of(id2label, config.get("problem_type"), self._top_k)
        inputs = self.metadata.inputs
        if self.input == "fp32":
            # Finite only: a NaN or infinite pixel would be answered with null scores.
            largest = float(np.finfo(np.float32).max)
            inputs = (TensorSpec("image", "FP32", self.size, minimum=-largest, maximum=largest),)
        self.metadata = dataclasses.replace(
            self.metadata, inputs=inputs, outputs=self.ranking.outputs()
        )

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        if self.input == "fp32":
            arrays, rejected = split_valid(items, self._prepared_of)
            if not arrays:
                return Prepared(None, 0, rejected)
            pixels = torch.from_numpy(np.stack(arrays))
        else:
            check = self._decoded_of if self.input == "encoded" else self._pixels_of
            images, rejected = split_valid(items, check)
            if not images:
                return Prepared(None, 0, rejected)
            prepared = self.processor(images=images, return_tensors="pt")["pixel_values"]
            pixels = torch.as_tensor(prepared)
        batch = to_device(pixels.to(self.settings.dtype), self.device)
        return Prepared(batch, len(batch), rejected)

    def infer(self, batch: torch.Tensor) -> Ranked:
        return self.ranking.rank(self.model(batch))

    def postprocess(self, outputs: Ranked) -> list[dict[str, Tensor]]:
        return self.ranking.answers(outputs)

    def example_item(self) -> Item:
        height, width = self.size[1:]
        if self.input == "fp32":
            return {"image": Tensor.from_numpy(np.zeros(self.size, np.float32))}
        pixels = np.full((2 * height, 2 * width, 3), 128, np.uint8)
        if self.input == "uint8":
            return {"image": Tensor.from_numpy(pixels)}
        encoded = _png(pixels)
        return {"image": Tensor(BYTES, (1,), [encoded])}

    def _decoded_of(self, item: Item) -> Any:
        tensor = require_input(item, ENCODED)
        assert isinstance(tensor.data, list)  # BYTES: a list of bytes
        return decode(tensor.data[0], (self.size[1], self.size[2]))

    def _pixels_of(self, item: Item) -> Any:
        pixels = require_input(item, PIXELS).to_numpy()
        if not pixels.size:
            raise InvalidItem(f"input 'image' holds no pixels: shape {list(pixels.shape)}")
        height, width = pixels.shape[:2]
        check_size(width, height)
        return fit(from_pixels(pixels), (self.size[1], self.size[2]))

    def _prepared_of(self, item: Item) -> np.ndarray:
        return require_input(item, self.metadata.inputs[0]).to_numpy()


def _network(
    path: Path, device: torch.device, settings: HandlerSettings
) -> tuple[Callable[[torch.Tensor], torch.Tensor], Mapping[str, Any]]:
    """The folder's classifier, as a function of a pixel batch to logits, and its config
    (`id2label`, `problem_type`; an exported one's `config.json` may hold them, or not be)."""
    dtype = settings.dtype
    if (path / EXPORTED_FILE).is_file():
        exported = load_exported(path / EXPORTED_FILE, device, dtype)
        check_max_batch(exported, path / EXPORTED_FILE, settings.max_batch_size)
        return exported.run, read_json(path / "config.json")
    from transformers import AutoModelForImageClassification

    model: Any = AutoModelForImageClassification.from_pretrained(str(path), local_files_only=True)
    model = model.to(device=device, dtype=dtype).eval()
    config = {"id2label": model.config.id2label, "problem_type": model.config.problem_type}
    return lambda pixels: model(pixel_values=pixels).logits, config


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    from_pixels(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
