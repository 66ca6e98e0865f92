"""RGB images to PNG bytes: the rows in two bands deflated side by side, one PNG filter per band chosen
on a sample, and zlib-ng's deflate.

Pillow's PNG encoder picks a filter per row by trying all five (the sum-of-absolute-values
heuristic) and deflates with zlib: about 21 ms for a 1280x800 text page and 70 ms for a
photo-like one at level 1, most of it the filter search and the deflate. A region of a screen is
mostly one kind of picture, so one filter for a band of rows loses little: text compresses best
unfiltered (its glyphs repeat byte for byte), flat areas with Up (rows of zeros, coded as runs), a
photo with Avg (the left and upper neighbours' mean predicts it: 740 KB of Huffman codes on the
bench's photo-like screen, where Up's rows take 763 KB with run-length matching and 786 KB with
Huffman codes, over scrot's 782 KB). Which one is measured on a sample of the band's rows (slices of
5 rows, a twentieth of them), deflated each way, then the band is deflated with zlib-ng
(python-zlib-ng, a wheel) in the way that keeps it at or under scrot's size (libpng at level 2 with
its per-row search).

The deflate is most of the time (15-17 ms of one core for a photo-like screen's rows, the rest of the
encoder 4-6 ms), and zlib-ng deflates with the GIL released, so an image is cut in two bands of rows,
the upper one encoded on a helper thread while the calling thread encodes the lower one: on two cores
an encoding takes 60-80% of the time it took on one. Each band is a raw deflate stream of its
own; the upper one ends on a sync flush (an empty stored block, byte-aligned and not final), so the
two laid end to end are one deflate stream, and between a zlib header and trailer (the Adler-32 of
all the rows, the two bands' combined) the single zlib stream a PNG's IDAT holds. The lower band
starts without the upper one's rows in its window: Huffman codes and runs never look back that far,
and unfiltered text loses 0.1-0.2% of its size (its lines repeat within a band). Cutting and
filtering are Pillow operations that hold the GIL (Avg's 1-2 ms a band, the others' under 1 ms).
An image under _SPLIT_BYTES is one band on the calling thread (a hand-over costs more than it saves).
Encoding alone, bench/run.py's screens as the sandbox shows them (its table has the screenshots end
to end), p50 on this 2-core machine while other work ran on it:

    1280x800 screen      Pillow level 1        scrot's bytes    before (one band)     this (two bands)
    text page            155.9 KB, 18-21 ms    153.5 KB         149.3 KB, 5.7 ms      149.4 KB, 4.7 ms
    photo-like page      814.5 KB, 55-70 ms    781.7 KB         763.4 KB, 19.3 ms     741.4 KB, 12.4 ms
"""

from __future__ import annotations

import io
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image, ImageChops
from zlib_ng import zlib_ng

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_NONE, _UP, _AVG = 0, 2, 3  # PNG filter types (the filter byte that starts each row)
# Deflate (level, strategy) per filter, measured on bench/run.py's screens: unfiltered text finds its
# repeats at level 4 (3 gives 152.2 KB, 2 158.5 KB: over scrot's); flat Up-filtered rows are runs of
# zeros, which run-length matching codes in a few bytes a row where Huffman codes alone take at least
# a bit a byte; Avg-filtered photos are small differences with few repeats, which Huffman codes alone
# take at 740 KB in 10-11 ms (run-length matching: the same size in 17 ms; level 3 on Up's rows 732 KB
# in 22 ms). (Paeth-filtered rows would take 636 KB, but the filter is no Pillow operation: 33 ms in
# numpy, which the image does not have.)
_DEFLATE = {
    _NONE: (4, zlib_ng.Z_DEFAULT_STRATEGY),
    _UP: (1, zlib_ng.Z_RLE),
    _AVG: (1, zlib_ng.Z_HUFFMAN_ONLY),
}
_SAMPLE_EVERY = 100  # rows: one slice of _SAMPLE_ROWS in each run of this many (5%): a band of 400 rows
# gets 4, several lines of text (one slice of 10 rows saw too few of them to find their repeats)
_SAMPLE_ROWS = 5
_PIECE = 1 << 14  # bytes of sample deflated between two looks at the size so far
# Filtered bytes under which the image is one band on the calling thread: a 1280x800 screen is 3 MB,
# a 256x256 crop 192 KB (its deflate 1-2 ms, no longer worth a hand-over and a second stream).
_SPLIT_BYTES = 1 << 18
_ADLER_BASE = 65521  # the largest prime below 2**16 (RFC 1950)

_helper_lock = threading.Lock()
_helper: ThreadPoolExecutor | None = None


def _helper_pool() -> ThreadPoolExecutor:
    """The one thread that encodes upper bands, started on first use (a controller that never sends a
    PNG never starts it). Calls from several threads at once queue there and still come out whole."""
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-png")
        return _helper


@dataclass(frozen=True, slots=True)
class _Band:
    deflated: bytes  # raw deflate (no zlib header): sync-flushed, or final for the last band
    adler: int  # Adler-32 of the band's filtered rows alone
    length: int  # bytes of filtered rows
    level: int


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib_ng.crc32(data, zlib_ng.crc32(kind)))


def _filtered(image: Image.Image, top: int, bottom: int, kind: int) -> Image.Image:
    """Rows ``top`` to ``bottom`` with ``kind``'s filter: for Up, each byte minus the one above it
    modulo 256 (above row 0 is a row of zeros: a crop past the edge fills with them)."""
    width = image.width
    rows = image.crop((0, top, width, bottom))
    if kind == _NONE:
        return rows
    above = image.crop((0, top - 1, width, bottom - 1))
    if kind == _UP:
        return ImageChops.subtract_modulo(rows, above)
    # Avg: each byte minus floor((left + above) / 2), the left byte being the same channel of the pixel
    # before (zero before the first). Pillow's add computes (a + b) / scale in floats and truncates:
    # exactly the floor PNG wants, for every pair of bytes (tests/unit/sandbox/display/test_png.py tries all).
    left = image.crop((-1, top, width - 1, bottom))
    return ImageChops.subtract_modulo(rows, ImageChops.add(left, above, scale=2.0))


def _lines(body: Image.Image, kind: int) -> bytes:
    """Filtered rows as PNG wants them: each row's filter byte, then the row's bytes."""
    width, height = body.size
    lines = Image.new("L", (3 * width + 1, height), kind)
    lines.paste(Image.frombuffer("L", (3 * width, height), body.tobytes(), "raw", "L", 0, 1), (1, 0))
    return lines.tobytes()


def _sample(image: Image.Image, top: int, bottom: int, kind: int) -> bytes:
    """Slices of _SAMPLE_ROWS rows spread over rows ``top`` to ``bottom``, filtered as in the image
    (each slice's first row against the real row above it), as filtered lines one after the other."""
    width = image.width
    starts = range(top, bottom, _SAMPLE_EVERY)
    sample = Image.new("RGB", (width, sum(min(_SAMPLE_ROWS, bottom - s) for s in starts)))
    at = 0
    for start in starts:
        end = min(start + _SAMPLE_ROWS, bottom)
        sample.paste(_filtered(image, start, end, kind), (0, at))
        at += end - start
    return _lines(sample, kind)


def choose_filter(image: Image.Image, top: int = 0, bottom: int | None = None) -> int:
    """0 (None), 2 (Up) or 3 (Avg) for rows ``top`` to ``bottom`` (all by default): the filter whose
    rows, deflated as encode_png would, come out smallest on a sample of them (ties go to None, then
    Up). Up's run-length and Avg's Huffman codes are fast on anything; the unfiltered sample is
    deflated last and dropped as soon as it outgrows the better of them: on a photo that is early,
    and level 4 on noise is the slow part."""
    bottom = image.height if bottom is None else bottom
    rows = _sample(image, top, bottom, _UP)
    best, kind = len(_deflate(rows, *_DEFLATE[_UP])), _UP
    # Huffman codes alone spend at least a bit on every byte: when Up's runs already beat that (text,
    # flat pages), Avg's sample need not be tried.
    if best > len(rows) // 8:
        avg = len(_deflate(_sample(image, top, bottom, _AVG), *_DEFLATE[_AVG]))
        if avg < best:
            best, kind = avg, _AVG
    return _NONE if _deflates_within(_sample(image, top, bottom, _NONE), best, *_DEFLATE[_NONE]) else kind


def _deflates_within(data: bytes, limit: int, level: int, strategy: int) -> bool:
    deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 15, 8, strategy)
    view, size = memoryview(data), 0
    for start in range(0, len(data), _PIECE):
        size += len(deflate.compress(view[start : start + _PIECE]))
        if size > limit:
            return False
    return size + len(deflate.flush()) <= limit


def _deflate(data: bytes, level: int, strategy: int) -> bytes:
    deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, 15, 8, strategy)
    return deflate.compress(data) + deflate.flush()


def _encode_band(image: Image.Image, top: int, bottom: int, last: bool) -> _Band:
    kind = choose_filter(image, top, bottom)
    data = _lines(_filtered(image, top, bottom, kind), kind)
    level, strategy = _DEFLATE[kind]
    deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, -15, 8, strategy)  # raw: no header, no trailer
    deflated = deflate.compress(data) + deflate.flush(zlib_ng.Z_FINISH if last else zlib_ng.Z_SYNC_FLUSH)
    return _Band(deflated, zlib_ng.adler32(data), len(data), level)


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of two byte strings laid end to end, from each one's own (zlib's adler32_combine,
    which Python's zlib modules do not expose)."""
    rem = second_length % _ADLER_BASE
    low = ((first & 0xFFFF) + (second & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
    high = (rem * (first & 0xFFFF) + (first >> 16) + (second >> 16) + _ADLER_BASE - rem) % _ADLER_BASE
    return low | high << 16


def _zlib_header(level: int) -> bytes:
    """CMF (deflate, 32 KiB window) and FLG: FLEVEL says how hard the deflate tried (informative only)
    and FCHECK makes the pair a multiple of 31 (RFC 1950)."""
    flevel = 0 if level <= 1 else 1 if level <= 5 else 2 if level == 6 else 3
    head = 0x78 << 8 | flevel << 6
    return struct.pack(">H", head + 31 - head % 31)


def encode_png(image: Image.Image) -> bytes:
    """A PNG of ``image`` (RGB; other modes go through Pillow's encoder) that decodes to its exact pixels."""
    if image.mode != "RGB" or 0 in image.size:
        return _pillow_png(image)
    width, height = image.size
    image.load()  # both threads read its pixels: loaded here, before either does
    if height < 2 or (3 * width + 1) * height < _SPLIT_BYTES:
        bands = [_encode_band(image, 0, height, last=True)]
    else:
        middle = height // 2
        upper: Future[_Band] = _helper_pool().submit(_encode_band, image, 0, middle, False)
        lower = _encode_band(image, middle, height, last=True)
        bands = [upper.result(), lower]
    adler = 1  # Adler-32 of nothing
    for band in bands:
        adler = adler32_combine(adler, band.adler, band.length)
    level = max(band.level for band in bands)
    data = b"".join([_zlib_header(level), *(band.deflated for band in bands), struct.pack(">I", adler)])
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, deflate, no interlace
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def _pillow_png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=1)
    return buf.getvalue()
