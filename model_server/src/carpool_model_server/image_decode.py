"""Encoded images (JPEG, PNG) to RGB pixels with Pillow, bounded before they are decoded.

An image file states its size in its header, and a few bytes can claim 40,000 x 40,000
pixels: `Image.open` reads only the header, so the size is checked against MAX_PIXELS
before a byte of pixels is decoded. A JPEG is decoded at the smallest of its built-in scales
(1/2, 1/4, 1/8) that still covers twice the size the model takes, and any image larger than
that is shrunk by a whole factor right after it is decoded (`fit`), so a batch holds one
full-size image at a time, not one per item. An image whose sides differ more than
MAX_ASPECT times is refused: a processor that resizes the shorter side to the model's would
make a 1 x 4000 PNG of 100 bytes into gigabytes. A truncated or corrupt file fails the
decode: each failure is the item's `InvalidItem` (400), naming what is wrong. An image is
turned upright as its EXIF orientation says, as viewers and transformers' `load_image` do.
"""

from __future__ import annotations

import io
import struct
import warnings

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError
from PIL.JpegImagePlugin import JpegImageFile

from carpool_model_server.errors import InvalidItem

FORMATS = ("JPEG", "PNG")
# 25 megapixels: a 6000 x 4000 photo; decoded as RGB, 75 MB at most per item.
MAX_PIXELS = 25_000_000
# The most one encoded image may take on the wire (max_element_bytes).
MAX_IMAGE_BYTES = 32 << 20
# Wider than any panorama a classifier is given; the shorter side resized to 256, still
# under a megapixel.
MAX_ASPECT = 12


def decode(data: bytes, size: tuple[int, int]) -> Image.Image:
    """The RGB image `data` encodes; `size` (height, width) is what the model takes."""
    try:
        with warnings.catch_warnings():
            # Pillow warns past its own bomb limit, which is above ours; ours decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise InvalidItem(f"not a {' or '.join(FORMATS)} image") from None
    except Image.DecompressionBombError as error:
        raise InvalidItem(f"image over {MAX_PIXELS} pixels: {error}") from None
    except (OSError, SyntaxError, ValueError) as error:  # a header cut short or corrupt
        raise InvalidItem(f"not a readable {' or '.join(FORMATS)} image: {error}") from None
    check_size(*image.size)
    if isinstance(image, JpegImageFile):  # a camera's multi-picture (MPO) file too
        image.draft("RGB", (2 * size[1], 2 * size[0]))
    try:
        pixels: Image.Image = image
        if image.mode.startswith("I"):
            # 16-bit greyscale: Pillow's conversion to RGB would clip every shade over 255.
            pixels = image.convert("I").point(lambda value: value * (1 / 256))
        decoded = fit(pixels.convert("RGB"), size)
    except (OSError, SyntaxError, ValueError) as error:
        raise InvalidItem(f"{image.format} image could not be decoded: {error}") from None
    return _upright(decoded)


def _upright(image: Image.Image) -> Image.Image:
    """`image` as it is shown: a phone stores photos as its sensor reads them, with an EXIF
    orientation. Where the EXIF block is corrupt (Pillow fails to write it back), as stored."""
    try:
        return ImageOps.exif_transpose(image)
    except (struct.error, OSError, SyntaxError, ValueError, TypeError):
        return image


def check_size(width: int, height: int) -> None:
    """InvalidItem for an image of more than MAX_PIXELS, or sides too unequal."""
    if width * height > MAX_PIXELS:
        raise InvalidItem(
            f"image of {width}x{height} pixels, over the limit of {MAX_PIXELS} pixels"
        )
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise InvalidItem(
            f"image of {width}x{height} pixels: one side is over {MAX_ASPECT} times the other"
        )


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` shrunk by the largest whole factor that leaves it covering twice `size`
    (height, width), averaging each square of pixels, as a JPEG's scaled decode does."""
    width, height = image.size
    factor = min(width // (2 * size[1]), height // (2 * size[0]))
    return image.reduce(factor) if factor > 1 else image


def from_pixels(pixels: npt.NDArray[np.uint8]) -> Image.Image:
    """An image of RGB pixels, height x width x 3."""
    return Image.fromarray(np.ascontiguousarray(pixels))
