"""Images as a client sends them: pixels encoded in a file format."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
from PIL import Image


def encoded(pixels: npt.NDArray[np.uint8], format: str) -> bytes:
    """`pixels` (height, width, 3) as a file of `format` (PNG, JPEG) would hold them."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=format)
    return buffer.getvalue()


def decoded(data: bytes) -> Image.Image:
    """The RGB image a file holds, as a model in process would be given it."""
    return Image.open(io.BytesIO(data)).convert("RGB")
