"""How far two images differ, as a person would see it (pure, Pillow): the share of pixels whose grey
level differs visibly once both are blurred a little, the replayed image scaled to the recorded one's
size, masked regions left out. Replay judges a step's screen by it (:mod:`corral.recording.replay`),
and a code cell's image results (:mod:`corral.recording.codejudge`)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageChops, ImageFilter

PIXEL_DELTA = 40  # a grey-level difference (0-255) a person would notice after the blur
# An image the sandbox made is decoded here: refused past this many pixels (a decompression bomb),
# well above any screen or chart.
MAX_PIXELS = 40_000_000


@dataclass(frozen=True, slots=True)
class Mask:
    """A region to ignore, in the recorded frame's pixels: x, y, width, height."""

    x: int
    y: int
    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> Mask:
        parts = text.split(",")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"a mask is x,y,width,height in whole pixels, not {text!r}")
        x, y, w, h = (int(p) for p in parts)
        if w == 0 or h == 0:
            raise ValueError(f"a mask needs a width and a height: {text!r}")
        return cls(x, y, w, h)


@dataclass(frozen=True, slots=True)
class Comparison:
    score: float  # the share of pixels that differ visibly
    diff_png: bytes


def _opened(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    if image.width * image.height > MAX_PIXELS:
        raise ValueError(f"an image of {image.width}x{image.height} pixels is past the {MAX_PIXELS} compared")
    return image


def _prepared(data: bytes, size: tuple[int, int], masks: tuple[Mask, ...]) -> Image.Image:
    image = _opened(data).convert("L")
    if image.size != size:
        image = image.resize(size)
    for mask in masks:
        image.paste(0, (mask.x, mask.y, mask.x + mask.width, mask.y + mask.height))
    return image.filter(ImageFilter.BoxBlur(1))


def compare(recorded: bytes, replayed: bytes, masks: tuple[Mask, ...] = ()) -> Comparison:
    """The share of visibly different pixels, and a picture of where (red on the recorded frame)."""
    base = _opened(recorded).convert("RGB")
    a = _prepared(recorded, base.size, masks)
    b = _prepared(replayed, base.size, masks)
    delta = ImageChops.difference(a, b).point(lambda v: 255 if v > PIXEL_DELTA else 0)
    changed = delta.histogram()[255]
    score = changed / (base.width * base.height)
    overlay = Image.blend(base, Image.new("RGB", base.size, (255, 255, 255)), 0.6)
    overlay.paste((230, 0, 0), mask=delta)
    out = io.BytesIO()
    overlay.save(out, "PNG")
    return Comparison(score, out.getvalue())


def similarity(recorded: bytes, replayed: bytes) -> float:
    """The share of pixels that differ visibly (0.0: the same to the eye), without the diff picture."""
    size = _opened(recorded).size
    delta = ImageChops.difference(_prepared(recorded, size, ()), _prepared(replayed, size, ()))
    return delta.point(lambda v: 255 if v > PIXEL_DELTA else 0).histogram()[255] / (size[0] * size[1])
