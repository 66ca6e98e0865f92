"""Frames to encoded images (PNG, JPEG, WebP) with crop, resize and an optional pointer overlay."""

from __future__ import annotations

import io
import os
import threading

from PIL import Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin

from corral.protocol.actions import ImageFormat, Region
from corral.protocol.plan import EncodedImage
from corral.sandbox.display.png import encode_png
from corral.sandbox.display.xcapture import CursorImage, Frame

MEDIA_TYPES: dict[ImageFormat, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
# The three formats' plugins, imported by name: a save in a format Pillow has not registered yet (WebP,
# for the recorder's frames) makes it import every plugin it has, about 4.7 MiB of the controller held
# for good (bench/gateway.py's idle session); registered here, none of the others is ever loaded.
PLUGINS = (JpegImagePlugin, PngImagePlugin, WebPImagePlugin)
DEFAULT_QUALITY = 80

# Pillow compresses a JPEG into a BytesIO in one C call that holds the GIL (5-6 ms at 1280x800,
# measured: every other thread, the controller's event loop included, stalls that long); into a file
# with a descriptor it releases the GIL (ImageFile._save's encode_to_file). So JPEGs go through a
# memory file, one per thread. WebP releases the GIL either way, and PNG's deflate does
# (corral.sandbox.display.png).
_spools = threading.local()


def _jpeg(image: Image.Image, quality: int) -> bytes:
    spool: io.FileIO | None = getattr(_spools, "jpeg", None)
    if spool is None:
        spool = _spools.jpeg = io.FileIO(os.memfd_create("corral-jpeg", os.MFD_CLOEXEC), "w+b")
    spool.seek(0)
    spool.truncate()
    image.save(spool, "JPEG", quality=quality)
    return os.pread(spool.fileno(), os.fstat(spool.fileno()).st_size, 0)


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
    q = DEFAULT_QUALITY if quality is None else quality
    if fmt == "jpeg":
        return EncodedImage(MEDIA_TYPES[fmt], _jpeg(image, q), image.width, image.height)
    if fmt == "png":
        return EncodedImage(MEDIA_TYPES[fmt], encode_png(image), image.width, image.height)
    buf = io.BytesIO()
    image.save(buf, "WEBP", quality=q, method=0)
    return EncodedImage(MEDIA_TYPES[fmt], buf.getvalue(), image.width, image.height)
