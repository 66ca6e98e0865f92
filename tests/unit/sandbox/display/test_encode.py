"""Frames to encoded images: BGRX decoding, formats, crop, resize and the pointer overlay (pure Pillow)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading

import pytest
from PIL import Image

from corral.protocol import Region
from corral.sandbox.display import encode as enc
from corral.sandbox.display.xcapture import CursorImage, Frame

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def bgrx_frame(width: int, height: int, pixel: object, padding: int = 0) -> Frame:
    """A Frame whose pixel (x, y) is ``pixel(x, y)`` as RGB, stored as BGRX rows of ``4*width + padding`` bytes."""
    stride = 4 * width + padding
    rows = bytearray()
    for y in range(height):
        for x in range(width):
            r, g, b = pixel(x, y)  # type: ignore[operator]
            rows += bytes((b, g, r, 0xAA))
        rows += b"\x55" * padding
    return Frame(width=width, height=height, stride=stride, data=bytes(rows))


def quadrants(x: int, y: int, width: int = 64, height: int = 40) -> tuple[int, int, int]:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    left, top = x < width // 2, y < height // 2
    return {(True, True): RED, (False, True): GREEN, (True, False): BLUE, (False, False): WHITE}[(left, top)]


@pytest.fixture
def image() -> Image.Image:
    return enc.frame_to_image(bgrx_frame(64, 40, quadrants))


def decoded(data: bytes) -> Image.Image:
    out = Image.open(io.BytesIO(data))
    out.load()
    return out


def close(a: tuple[int, ...], b: tuple[int, ...], tolerance: int = 12) -> bool:
    return all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("padding", [0, 4, 12])
def test_frame_to_image_reads_bgrx_with_any_stride(padding: int) -> None:
    img = enc.frame_to_image(bgrx_frame(64, 40, quadrants, padding=padding))
    assert img.mode == "RGB"
    assert img.size == (64, 40)
    assert img.getpixel((0, 0)) == RED
    assert img.getpixel((63, 0)) == GREEN
    assert img.getpixel((0, 39)) == BLUE
    assert img.getpixel((63, 39)) == WHITE
    assert img.getpixel((31, 19)) == RED
    assert img.getpixel((32, 20)) == WHITE


def test_frame_to_image_keeps_channel_order() -> None:
    img = enc.frame_to_image(bgrx_frame(2, 1, lambda x, y: (10, 20, 30) if x == 0 else (200, 100, 50)))
    assert img.getpixel((0, 0)) == (10, 20, 30)
    assert img.getpixel((1, 0)) == (200, 100, 50)


@pytest.mark.parametrize(
    ("fmt", "media_type", "magic"),
    [
        ("png", "image/png", b"\x89PNG\r\n\x1a\n"),
        ("jpeg", "image/jpeg", b"\xff\xd8\xff"),
        ("webp", "image/webp", b"RIFF"),
    ],
)
def test_formats(image: Image.Image, fmt: enc.ImageFormat, media_type: str, magic: bytes) -> None:
    out = enc.encode(image, fmt)
    assert out.media_type == media_type
    assert out.data.startswith(magic)
    assert (out.width, out.height) == (64, 40)
    back = decoded(out.data)
    assert back.format == {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt]
    assert back.size == (64, 40)
    assert close(back.convert("RGB").getpixel((5, 5)), RED)
    assert close(back.convert("RGB").getpixel((60, 35)), WHITE)
    assert out.settle_ms is None and out.settled is None


def test_media_types_cover_every_format() -> None:
    assert enc.MEDIA_TYPES == {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def test_png_is_lossless(image: Image.Image) -> None:
    back = decoded(enc.encode(image, "png").data).convert("RGB")
    assert back.tobytes() == image.tobytes()


def test_default_is_png(image: Image.Image) -> None:
    assert enc.encode(image).media_type == "image/png"


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_quality_changes_lossy_output(fmt: enc.ImageFormat) -> None:
    noisy = Image.effect_noise((128, 128), 80).convert("RGB")
    low = enc.encode(noisy, fmt, quality=5)
    high = enc.encode(noisy, fmt, quality=95)
    default = enc.encode(noisy, fmt)
    assert len(low.data) < len(default.data) < len(high.data)


@pytest.mark.parametrize(
    ("region", "size", "corner"),
    [
        (Region(x=0, y=0, width=32, height=20), (32, 20), RED),
        (Region(x=32, y=0, width=32, height=20), (32, 20), GREEN),
        (Region(x=0, y=20, width=10, height=20), (10, 20), BLUE),
        (Region(x=40, y=25, width=24, height=15), (24, 15), WHITE),
        (Region(x=63, y=39, width=1, height=1), (1, 1), WHITE),
    ],
)
def test_crop_region(image: Image.Image, region: Region, size: tuple[int, int], corner: tuple[int, int, int]) -> None:
    out = enc.encode(image, "png", region=region)
    assert (out.width, out.height) == size
    back = decoded(out.data).convert("RGB")
    assert back.size == size
    assert back.getpixel((0, 0)) == corner
    assert back.getcolors() == [(size[0] * size[1], corner)]  # each region lies in one quadrant


def test_crop_to_the_whole_image_is_the_image(image: Image.Image) -> None:
    whole = enc.encode(image, "png", region=Region(x=0, y=0, width=64, height=40))
    assert (whole.width, whole.height) == (64, 40)
    assert decoded(whole.data).convert("RGB").tobytes() == image.tobytes()


def test_crop_region_spanning_quadrants(image: Image.Image) -> None:
    back = decoded(enc.encode(image, "png", region=Region(x=30, y=18, width=4, height=4)).data).convert("RGB")
    assert back.getpixel((0, 0)) == RED
    assert back.getpixel((3, 0)) == GREEN
    assert back.getpixel((0, 3)) == BLUE
    assert back.getpixel((3, 3)) == WHITE


@pytest.mark.parametrize(
    ("width", "scale", "size"),
    [
        (32, None, (32, 20)),
        (128, None, (128, 80)),
        (64, None, (64, 40)),
        (10, None, (10, 6)),  # 6.25 rounds to 6
        (None, 0.5, (32, 20)),
        (None, 2, (128, 80)),
        (None, 1, (64, 40)),
        (None, 0.01, (1, 1)),  # never below one pixel
        (None, None, (64, 40)),
    ],
)
def test_resize(image: Image.Image, width: int | None, scale: float | None, size: tuple[int, int]) -> None:
    out = enc.encode(image, "png", width=width, scale=scale)
    assert (out.width, out.height) == size
    assert decoded(out.data).size == size


def test_width_wins_over_scale(image: Image.Image) -> None:
    out = enc.encode(image, "png", width=16, scale=3)
    assert (out.width, out.height) == (16, 10)


def test_crop_then_resize(image: Image.Image) -> None:
    out = enc.encode(image, "jpeg", region=Region(x=32, y=0, width=32, height=20), width=64)
    assert (out.width, out.height) == (64, 40)
    back = decoded(out.data).convert("RGB")
    assert close(back.getpixel((32, 20)), GREEN)


def test_resized_colours_survive(image: Image.Image) -> None:
    back = decoded(enc.encode(image, "png", scale=0.5).data).convert("RGB")
    assert close(back.getpixel((2, 2)), RED)
    assert close(back.getpixel((29, 17)), WHITE)


def test_encode_leaves_the_input_alone(image: Image.Image) -> None:
    before = image.tobytes()
    enc.encode(image, "webp", region=Region(x=0, y=0, width=8, height=8), width=100)
    assert image.size == (64, 40)
    assert image.tobytes() == before


def test_overlay_cursor() -> None:
    base = Image.new("RGB", (10, 10), BLUE)
    # 2x2 sprite, premultiplied BGRA: opaque red, transparent, opaque white, transparent.
    sprite = bytes((0, 0, 255, 255, 0, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0))
    out = enc.overlay_cursor(base, CursorImage(x=3, y=4, width=2, height=2, bgra=sprite))
    assert out.getpixel((3, 4)) == RED
    assert out.getpixel((4, 4)) == BLUE
    assert out.getpixel((3, 5)) == WHITE
    assert out.getpixel((4, 5)) == BLUE
    assert out.getpixel((0, 0)) == BLUE
    assert base.getpixel((3, 4)) == BLUE  # a copy is drawn on


def test_overlay_cursor_half_transparent() -> None:
    base = Image.new("RGB", (4, 4), (0, 0, 0))
    # Premultiplied 50% white: BGR 128, alpha 128.
    out = enc.overlay_cursor(base, CursorImage(x=0, y=0, width=1, height=1, bgra=bytes((128, 128, 128, 128))))
    assert close(out.getpixel((0, 0)), (128, 128, 128), tolerance=3)


def test_jpeg_through_the_memory_file_is_what_pillow_writes() -> None:
    # A big frame, then a small one: the memory file is emptied between them, never read stale.
    big = Image.effect_noise((640, 400), 64).convert("RGB")
    small = Image.new("RGB", (8, 8), (200, 10, 10))
    for picture in (big, small, big):
        expected = io.BytesIO()
        picture.save(expected, "JPEG", quality=70)
        assert enc.encode(picture, "jpeg", quality=70).data == expected.getvalue()


def test_each_thread_has_its_own_memory_file() -> None:
    picture = Image.new("RGB", (64, 64), (0, 90, 200))
    results: list[bytes] = []

    def encode_many() -> None:
        results.extend(enc.encode(picture, "jpeg", quality=60).data for _ in range(20))

    threads = [threading.Thread(target=encode_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80 and len(set(results)) == 1


def test_encoding_loads_only_the_three_formats_plugins() -> None:
    # A save in a format Pillow has not registered makes it import all its plugins, megabytes held for
    # good by every sandbox's controller (bench/gateway.py): the three are registered by name.
    probe = """
import sys
from corral.sandbox.display import encode
from PIL import Image
image = Image.new("RGB", (32, 16))
for fmt in ("png", "jpeg", "webp"):
    assert encode.encode(image, fmt).data
print(sorted(name for name in sys.modules if name.startswith("PIL.") and name.endswith("ImagePlugin")))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    # Pillow's preinit (its five commonest formats) and WebP: not the forty-odd of its full init.
    preinit = ["PIL.BmpImagePlugin", "PIL.GifImagePlugin", "PIL.JpegImagePlugin", "PIL.PngImagePlugin"]
    assert out.strip() == str(sorted([*preinit, "PIL.PpmImagePlugin", "PIL.WebPImagePlugin"]))
