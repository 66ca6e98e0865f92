"""Frames to encoded images (PNG, JPEG, WebP) with crop, resize and an optional pointer overlay."""

from __future__ import annotations

import io

from PIL import Image

from corral.protocol.actions import ImageFormat, Region
from corral.protocol.plan import EncodedImage
from corral.sandbox.xcapture import CursorImage, Frame

MEDIA_TYPES: dict[ImageFormat, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
DEFAULT_QUALITY = 80


def frame_to_image(frame: Frame) -> Image.Image:
    return Image.frombuffer("RGB", (frame.width, frame.height), frame.data, "raw", "BGRX", frame.stride, 1)


def overlay_cursor(image: Image.Image, cursor: CursorImage) -> Image.Image:
    sprite = Image.frombuffer("RGBa", (cursor.width, cursor.height), cursor.bgra, "raw", "BGRa", 0, 1)
    out = image.copy()
    out.paste(sprite.convert("RGBA"), (cursor.x, cursor.y), sprite.convert("RGBA"))
    return out


def encode(
    image: Image.Image,
    fmt: ImageFormat = "png",
    *,
    quality: int | None = None,
    region: Region | None = None,
    width: int | None = None,
    scale: float | None = None,
) -> EncodedImage:
    """Crop to ``region``, resize to ``width`` or by ``scale``, then encode."""
    if region is not None:
        image = image.crop((region.x, region.y, region.x + region.width, region.y + region.height))
    target = image.size
    if width is not None and width != image.width:
        target = (width, max(1, round(image.height * width / image.width)))
    elif scale is not None and scale != 1:
        target = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    if target != image.size:
        image = image.resize(target, Image.Resampling.BILINEAR, reducing_gap=2.0)
    buf = io.BytesIO()
    q = DEFAULT_QUALITY if quality is None else quality
    if fmt == "png":
        # Level 1 costs about half of the default's time for a few percent more bytes.
        image.save(buf, "PNG", compress_level=1)
    elif fmt == "jpeg":
        image.save(buf, "JPEG", quality=q)
    else:
        image.save(buf, "WEBP", quality=q, method=0)
    return EncodedImage(MEDIA_TYPES[fmt], buf.getvalue(), image.width, image.height)
