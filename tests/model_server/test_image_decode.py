"""Encoded images cost the handler what their pixels are worth to the model: a long thin
one is refused before it is decoded, a large one is shrunk as soon as it is."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from carpool_model_server.errors import InvalidItem
from carpool_model_server.image_decode import decode


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_long_thin_png_is_refused_naming_its_sides() -> None:
    # 97 bytes; resized to a shorter side of 256 it would be 256 x 1,024,000 pixels.
    with pytest.raises(InvalidItem, match="4000x1 pixels: one side is over 12 times"):
        decode(png(4000, 1), (224, 224))


def test_a_large_png_is_shrunk_as_it_is_decoded() -> None:
    image = decode(png(1000, 700), (32, 32))
    # A whole factor (10) that leaves it covering twice the model's 32 x 32.
    assert image.size == (100, 70)
    assert np.asarray(image)[0, 0].tolist() == [10, 20, 30]


def test_a_photo_is_turned_upright_as_its_exif_orientation_says() -> None:
    # Stored 40 wide, red on the left; orientation 6: the camera was turned a quarter.
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20, 0] = pixels[:, 20:, 2] = 255
    stored = Image.fromarray(pixels)
    exif = stored.getexif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    stored.save(buffer, format="PNG", exif=exif.tobytes())
    upright = np.asarray(decode(buffer.getvalue(), (32, 32)))
    # As a viewer (and transformers' load_image) shows it: 20 wide, red on top.
    assert upright.shape == (40, 20, 3)
    assert upright[0, 0].tolist() == [255, 0, 0] and upright[-1, 0].tolist() == [0, 0, 255]


def test_a_16_bit_greyscale_png_keeps_its_shades() -> None:
    shades = np.array([[0, 0x4000], [0x8000, 0xFFFF]], np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(shades).save(buffer, format="PNG")
    grey = np.asarray(decode(buffer.getvalue(), (32, 32)))[..., 0]
    assert grey.tolist() == [[0, 64], [128, 255]]


def test_a_camera_s_multi_picture_jpeg_is_decoded_at_a_jpeg_s_scale() -> None:
    photo = Image.new("RGB", (2000, 1500), (10, 200, 30))
    multi, plain = io.BytesIO(), io.BytesIO()
    photo.save(multi, format="MPO", save_all=True, append_images=[photo])
    photo.save(plain, format="JPEG")
    # Decoded at 1/2 (1000 x 750, still twice 224), not in full and then shrunk.
    assert decode(multi.getvalue(), (224, 224)).size == (1000, 750)
    assert decode(plain.getvalue(), (224, 224)).size == (1000, 750)


def test_a_png_header_cut_short_is_refused_as_unreadable() -> None:
    # The IHDR chunk states 13 bytes and holds 2.
    cut = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00"
    with pytest.raises(InvalidItem, match="not a readable JPEG or PNG image"):
        decode(cut, (32, 32))


def test_a_corrupt_exif_block_leaves_the_photo_as_stored() -> None:
    stored = Image.new("RGB", (40, 20), (200, 0, 0))
    exif = stored.getexif()
    exif[0x0112], exif[0x010F] = 6, "cam"
    # The camera-make tag (ASCII) renumbered as a tag of numbers, as a bit flip might.
    corrupt = exif.tobytes().replace(b"\x01\x0f\x00\x02", b"\x01\x52\x00\x02")
    buffer = io.BytesIO()
    stored.save(buffer, format="JPEG", exif=corrupt)
    assert decode(buffer.getvalue(), (32, 32)).size == (40, 20)
