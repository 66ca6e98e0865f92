"""PNG bytes from RGB images: exact pixels back, a valid stream (one zlib stream over two bands deflated
side by side), the filter chosen by content per band, no bigger than before."""

from __future__ import annotations

import io
import random
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image, ImageChops, ImageDraw, ImageFilter

from corral.sandbox.display import png
from corral.sandbox.display.png import adler32_combine, choose_filter, encode_png

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


def test_text_goes_unfiltered_and_photos_with_avg() -> None:
    text, picture = text_page(), photo()
    assert choose_filter(text) == 0
    assert choose_filter(form()) == 0  # flat: long runs either way, and unfiltered ones repeat further back
    assert choose_filter(picture) == 3  # Avg: the left and upper neighbours predict a smooth picture best
    assert filter_bytes(encode_png(text), *text.size) == {0}
    assert filter_bytes(encode_png(picture), *picture.size) == {3}


def test_flat_rows_are_never_huffman_coded_alone() -> None:
    """A flat page (one colour between a few edges): Huffman codes alone spend at least a bit on every
    byte (48 KB for a blank 1280x400 band), runs and repeats a few bytes for a whole row."""
    image = form()
    assert 3 not in filter_bytes(encode_png(image), *image.size)
    assert len(encode_png(image)) < 16_000


def mixed(width: int = 1280, height: int = 800) -> Image.Image:
    """A photo above, an article below: a page with a picture at its head."""
    image = text_page(width, height)
    image.paste(photo(width, height // 2), (0, 0))
    return image


def test_each_band_gets_its_own_filter() -> None:
    """The image is two bands, each with the filter its own rows want: Avg for the photo, None for the
    text (one filter for the whole image gave the text Avg's Huffman codes, 2.4x its size here)."""
    image = mixed()
    data = encode_png(image)
    assert filter_bytes(data, *image.size) == {3, 0}
    assert decoded(data).tobytes() == image.tobytes()
    whole = Image.new("RGB", (image.width, image.height // 2))
    whole.paste(image.crop((0, image.height // 2, image.width, image.height)))
    assert len(encode_png(image)) < len(encode_png(photo(1280, 400))) + 2 * len(encode_png(whole))


def test_avg_takes_the_floor_of_every_pair_of_bytes() -> None:
    """Avg's predictor is floor((left + above) / 2); Pillow's add(scale=2) gives it for all 65,536 pairs."""
    left = Image.merge(
        "RGB", [Image.linear_gradient("L").rotate(90, expand=True).transpose(Image.Transpose.FLIP_LEFT_RIGHT)] * 3
    )
    above = Image.merge("RGB", [Image.linear_gradient("L")] * 3)
    assert {left.getpixel((x, 0))[0] for x in range(256)} == set(range(256))
    assert {above.getpixel((0, y))[0] for y in range(256)} == set(range(256))
    mean = ImageChops.add(left, above, scale=2.0).tobytes()
    a, b = left.tobytes(), above.tobytes()
    assert mean == bytes((x + y) // 2 for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", [0, 2, 3])
def test_every_filter_round_trips_noise(kind: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full-range noise through each filter, its bytes against PNG's definition, then decoded by Pillow."""
    rng = random.Random(kind)
    width, height = 37, 23
    image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    raw = image.tobytes()
    got = png._filtered(image, 0, height, kind).tobytes()

    def at(x: int, y: int) -> int:
        return raw[y * width * 3 + x] if x >= 0 and y >= 0 else 0

    want = bytes(
        (at(x, y) - (0 if kind == 0 else at(x, y - 1) if kind == 2 else (at(x - 3, y) + at(x, y - 1)) // 2)) % 256
        for y in range(height)
        for x in range(width * 3)
    )
    assert got == want
    monkeypatch.setattr(png, "choose_filter", lambda *_: kind)
    data = encode_png(image)
    assert filter_bytes(data, width, height) == {kind}
    assert decoded(data).tobytes() == raw


@pytest.mark.parametrize("size", [(1280, 800), (1281, 801), (700, 125), (641, 205), (3, 90000)])
def test_two_bands_make_one_zlib_stream(size: tuple[int, int]) -> None:
    """Big enough to be cut in two: zlib checks the header, the joined deflate stream and the combined
    Adler-32 as it inflates, and Pillow gets the exact pixels back."""
    width, height = size
    assert (3 * width + 1) * height >= png._SPLIT_BYTES
    image = mixed(width, height) if width > 100 else photo(width, height)
    data = encode_png(image)
    assert [kind for kind, _ in chunks(data)] == [b"IHDR", b"IDAT", b"IEND"]
    filter_bytes(data, width, height)  # zlib.decompress: header, stream, Adler-32
    assert decoded(data).tobytes() == image.tobytes()


def test_small_images_stay_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under _SPLIT_BYTES one band, encoded where it is asked for; above, the upper band on the helper."""
    seen: list[tuple[int, str]] = []
    real = png._encode_band

    def spy(image: Image.Image, top: int, bottom: int, last: bool) -> object:
        seen.append((top, threading.current_thread().name))
        return real(image, top, bottom, last)

    monkeypatch.setattr(png, "_encode_band", spy)
    me = threading.current_thread().name
    encode_png(photo(200, 100))
    assert seen == [(0, me)]
    seen.clear()
    encode_png(photo(1280, 400))
    assert len(seen) == 2
    assert dict(seen)[200] == me
    assert dict(seen)[0].startswith("corral-png")


def test_many_threads_at_once_each_get_their_own_image() -> None:
    images = [photo(640 + i, 400 + i) for i in range(4)] + [text_page(1280, 400 + i) for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(encode_png, images * 2))
    for image, data in zip(images * 2, outs, strict=True):
        assert decoded(data).tobytes() == image.tobytes()


@pytest.mark.parametrize("split", [0, 1, 7, 65520, 65521, 65522, 200000, 300000])
def test_adler32_combine_is_zlibs(split: int) -> None:
    data = random.Random(split).randbytes(300000)
    first, second = data[:split], data[split:]
    assert adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second)) == zlib.adler32(data)
    assert adler32_combine(1, zlib.adler32(data), len(data)) == zlib.adler32(data)


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
