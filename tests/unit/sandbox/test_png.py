"""PNG bytes from RGB images: exact pixels back, a valid stream, the filter chosen by content, no bigger than before."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from PIL import Image, ImageDraw, ImageFilter

from corral.sandbox.png import choose_filter, encode_png

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "sixty",
    "zebras",
    "quietly",
    "vex",
]


def text_page(width: int = 640, height: int = 400) -> Image.Image:
    """A white page of dark text lines, as a text-heavy screen is."""
    rng = random.Random(7)
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for y in range(8, height - 12, 14):
        draw.text((10, y), " ".join(rng.choice(WORDS) for _ in range(14)), fill=(20, 20, 20))
    return image


def form(width: int = 1280, height: int = 800) -> Image.Image:
    """A flat page: a bordered text box with a few words, a red button, a blue block."""
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.rectangle((20, 20, 620, 320), outline=(118, 118, 118))
    draw.text((26, 26), "abcdefghijklmnopqrst" * 3, fill=(0, 0, 0))
    draw.rectangle((700, 20, 900, 100), fill=(255, 0, 0))
    draw.rectangle((20, 600, 220, 640), fill=(0, 0, 255))
    return image


def photo(width: int = 640, height: int = 400) -> Image.Image:
    """Smooth colour gradients with blurred noise, as a photograph is."""
    rng = random.Random(3)
    noise = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    gradient = Image.merge(
        "RGB",
        (
            Image.linear_gradient("L").resize((width, height)),
            Image.radial_gradient("L").resize((width, height)),
            Image.linear_gradient("L").rotate(90).resize((width, height)),
        ),
    )
    return Image.blend(gradient, noise.filter(ImageFilter.GaussianBlur(2)), 0.35)


def decoded(data: bytes) -> Image.Image:
    out = Image.open(io.BytesIO(data))
    out.load()
    return out


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The PNG's chunks as (type, data), each one's CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body)
        out.append((kind, body))
        at += 12 + length
    return out


def filter_bytes(data: bytes, width: int, height: int) -> set[int]:
    raw = zlib.decompress(b"".join(body for kind, body in chunks(data) if kind == b"IDAT"))
    assert len(raw) == height * (3 * width + 1)
    return {raw[row * (3 * width + 1)] for row in range(height)}


def pillow_level_1(image: Image.Image) -> int:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return len(buf.getvalue())


@pytest.mark.parametrize("make", [text_page, photo, form])
def test_round_trips_to_the_exact_pixels(make: object) -> None:
    image = make()  # type: ignore[operator]
    back = decoded(encode_png(image))
    assert back.format == "PNG"
    assert back.mode == "RGB"
    assert back.tobytes() == image.tobytes()


@pytest.mark.parametrize("size", [(1, 1), (1, 9), (9, 1), (3, 401), (1281, 7), (333, 250)])
def test_any_size_round_trips(size: tuple[int, int]) -> None:
    image = photo(*size) if min(size) > 1 else Image.new("RGB", size, (1, 2, 3))
    assert decoded(encode_png(image)).tobytes() == image.tobytes()


def test_a_valid_stream_ihdr_idat_iend() -> None:
    image = text_page(200, 90)
    parts = chunks(encode_png(image))
    assert [kind for kind, _ in parts] == [b"IHDR", b"IDAT", b"IEND"]
    assert parts[0][1] == struct.pack(">IIBBBBB", 200, 90, 8, 2, 0, 0, 0)
    assert parts[2][1] == b""


def test_text_goes_unfiltered_and_photos_with_up() -> None:
    text, picture = text_page(), photo()
    assert choose_filter(text) == 0
    assert choose_filter(form()) == 0  # flat: long runs either way, and unfiltered ones repeat further back
    assert choose_filter(picture) == 2
    assert filter_bytes(encode_png(text), *text.size) == {0}
    assert filter_bytes(encode_png(picture), *picture.size) == {2}


@pytest.mark.parametrize("make", [text_page, photo, form])
def test_no_bigger_than_pillow_at_level_1(make: object) -> None:
    image = make(1280, 800)  # type: ignore[operator]
    assert len(encode_png(image)) <= pillow_level_1(image)


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_other_modes_go_through_pillow_and_round_trip(mode: str) -> None:
    image = text_page(120, 60).convert(mode)
    back = decoded(encode_png(image))
    assert back.mode == mode
    assert back.tobytes() == image.tobytes()
