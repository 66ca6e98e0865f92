"""RGB images to PNG bytes: one PNG filter for the whole image, chosen on a sample, and zlib-ng's deflate.

Pillow's PNG encoder picks a filter per row by trying all five (the sum-of-absolute-values
heuristic) and deflates with zlib: about 21 ms for a 1280x800 text page and 70 ms for a
photo-like one at level 1, most of it the filter search and the deflate. A screen is mostly one
kind of picture, so one filter for all its rows loses little: a text page compresses best
unfiltered (its glyphs repeat byte for byte), a photo with the Up filter (each row predicts the
next). Which one is measured on a sample of rows, deflated both ways (a twentieth of the image,
0.3-1.5 ms), then the whole image is deflated with zlib-ng (python-zlib-ng, a wheel) in the way
that keeps it at or under scrot's size (libpng at level 2 with its per-row search). Encoding
alone, one core, bench/run.py's screens (its table has the screenshots end to end):

    1280x800 screen      Pillow level 1 (before)   scrot's bytes    this
    text page            155.9 KB, 18-21 ms        153.5 KB         149.3 KB, 5-7 ms
    photo-like page      814.5 KB, 55-70 ms        781.7 KB         763.3 KB, 17-23 ms

zlib-ng, like CPython's zlib module it is ported from, deflates with the GIL released; the filter
and the row assembly below are Pillow operations (2-5 ms with the GIL held).
"""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image, ImageChops
from zlib_ng import zlib_ng

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_NONE, _UP = 0, 2  # PNG filter types (the filter byte that starts each row)
# Deflate (level, strategy) per filter, from the table above: unfiltered text finds its repeats at
# level 4 (3 gives 152.2 KB, 2 158.5 KB: over scrot's); Up-filtered photos are runs of small
# differences, which run-length matching codes at 763.3 KB in 14 ms where level 3 takes 22 ms for
# 732 KB and Huffman alone 786 KB (over scrot's). (Paeth-filtered rows would take 636 KB, but the
# filter is no Pillow operation: 33 ms in numpy.)
_DEFLATE = {_NONE: (4, zlib_ng.Z_DEFAULT_STRATEGY), _UP: (1, zlib_ng.Z_RLE)}
_SAMPLE_EVERY = 200  # rows: one band of _SAMPLE_ROWS in each run of this many (5%)
_SAMPLE_ROWS = 10
_PIECE = 1 << 14  # bytes of sample deflated between two looks at the size so far


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def _up(image: Image.Image) -> Image.Image:
    """Each byte minus the one above it, modulo 256 (the first row less a row of zeros)."""
    width, height = image.size
    return ImageChops.subtract_modulo(image, image.crop((0, -1, width, height - 1)))


def _lines(body: Image.Image, kind: int) -> bytes:
    """Filtered rows as PNG wants them: each row's filter byte, then the row's bytes."""
    width, height = body.size
    lines = Image.new("L", (3 * width + 1, height), kind)
    lines.paste(Image.frombuffer("L", (3 * width, height), body.tobytes(), "raw", "L", 0, 1), (1, 0))
    return lines.tobytes()


def _bands(image: Image.Image, shift: int) -> Image.Image:
    """Bands of rows spread over the image, stacked; ``shift`` -1 takes each band one row higher
    (the rows above, for the Up filter: above the first row is a row of zeros)."""
    width, height = image.size
    starts = range(0, height, _SAMPLE_EVERY)
    sample = Image.new("RGB", (width, len(starts) * _SAMPLE_ROWS))
    for i, top in enumerate(starts):
        sample.paste(image.crop((0, top + shift, width, top + shift + _SAMPLE_ROWS)), (0, i * _SAMPLE_ROWS))
    return sample


def choose_filter(image: Image.Image) -> int:
    """0 (None) or 2 (Up): the filter whose rows, deflated as encode_png would, come out smaller on a
    sample of the image (ties go to None). The unfiltered sample is deflated last and dropped as
    soon as it outgrows the Up one: on a photo that is early, and level 4 on noise is the slow part."""
    plain = _bands(image, 0)
    up = len(_deflate(_lines(ImageChops.subtract_modulo(plain, _bands(image, -1)), _UP), *_DEFLATE[_UP]))
    return _NONE if _deflates_within(_lines(plain, _NONE), up, *_DEFLATE[_NONE]) else _UP


def _deflates_within(data: bytes, limit: int, level: int, strategy: int) -> bool:
    deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 15, 8, strategy)
    view, size = memoryview(data), 0
    for start in range(0, len(data), _PIECE):
        size += len(deflate.compress(view[start : start + _PIECE]))
        if size > limit:
            return False
    return size + len(deflate.flush()) <= limit


def encode_png(image: Image.Image) -> bytes:
    """A PNG of ``image`` (RGB; other modes go through Pillow's encoder) that decodes to its exact pixels."""
    if image.mode != "RGB" or 0 in image.size:
        return _pillow_png(image)
    kind = choose_filter(image)
    width, height = image.size
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, deflate, no interlace
    body = _up(image) if kind == _UP else image
    data = _deflate(_lines(body, kind), *_DEFLATE[kind])
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def _deflate(data: bytes, level: int, strategy: int) -> bytes:
    deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 15, 8, strategy)
    return deflate.compress(data) + deflate.flush()


def _pillow_png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return buf.getvalue()
