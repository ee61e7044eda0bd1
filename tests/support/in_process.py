"""The tiny models of `support.tiny_models` run in process, as a served one must answer.

Texts go one at a time, so there is no padding to get wrong; each function loads the model
from its folder as a user would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from PIL import Image

from support.tiny_models import MAX_POSITIONS

Floats = npt.NDArray[np.float32]


def hidden_states(folder: Path, texts: Sequence[str]) -> list[Floats]:
    """Each text's last hidden states, [tokens, width], cut at the model's positions."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        return [model(**_tokens(tokenizer, text)).last_hidden_state[0].numpy() for text in texts]


def classify_texts(folder: Path, texts: Sequence[str]) -> Floats:
    """Each text's probabilities, [texts, labels] in the model's label order."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        rows = [model(**_tokens(tokenizer, text)).logits.softmax(-1)[0] for text in texts]
        return torch.stack(rows).numpy()


def classify_images(folder: Path, images: Sequence[Image.Image]) -> Floats:
    """Each image's probabilities, [images, labels], through the folder's own processor."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    processor: Any = AutoImageProcessor.from_pretrained(str(folder))
    model = AutoModelForImageClassification.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
        probabilities: Floats = model(pixel_values=pixels).logits.softmax(-1).numpy()
        return probabilities


def _tokens(tokenizer: Any, text: str) -> Any:
    return tokenizer(text, truncation=True, max_length=MAX_POSITIONS, return_tensors="pt")
