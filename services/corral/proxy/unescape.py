"""The scrubber's canonical pass: a text with its escapes decoded, and the way back to the original
bytes. Pure, stdlib only.

An upstream may escape some characters of a value and leave the others as they are (JSON's
``\\u0041`` for one letter, ``&#65;``, ``&#x41;`` or ``&excl;`` for another, ``%41`` for a third):
every reader (a JSON parser, a browser, a URL decoder) shows the value, and no fixed form of it is in
the bytes. So the text is decoded once, every kind of escape at once (:data:`TOKEN`), the values are
looked for in what that shows, and each one found is mapped back to the span of original bytes it
came from (widened to whole escapes), which is what gets replaced. Nested escapes (``&amp;#65;``,
``%2541``) are decoded :data:`LAYERS` deep.

The cost is linear: one ``re.sub`` over the text (a call per escape, cached per distinct escape),
the decoded copy, and, only when a value was found, one walk over the escapes up to the last value
(:func:`original_spans`). Decoding never lengthens a text (every escape decodes to at most its own
length), so the copy is never larger than the original.
"""

from __future__ import annotations

import bisect
import html
import re
from collections.abc import Iterator, Sequence

# One escape, of any kind a reader of the text decodes. Numeric references take any number of
# digits (browsers do: leading zeros pad nothing away), named ones any entity HTML5 knows, with or
# without the ';' (html.unescape decodes the legacy names without it as browsers do).
TOKEN = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a JSON surrogate pair
    rb"|\\u[0-9a-fA-F]{4}"
    rb'|\\["\\/bfnrt]'
    rb"|&#[xX][0-9a-fA-F]+;?"
    rb"|&#[0-9]+;?"
    rb"|&[A-Za-z][A-Za-z0-9]{0,31};?"
    rb"|%[0-9a-fA-F]{2}"
)
LEADS = (b"\\", b"&", b"%")  # an escape starts with one of these: a text without any has none
LAYERS = 2  # decoded twice at most: an escape of an escape (&amp;#65;) is read, a third layer is not
CACHE_MAX = 65536  # distinct escapes kept decoded per text (numeric ones may all differ)
REPLACEMENT = "\ufffd".encode()  # what a reader shows for a reference to no character
_JSON_SIMPLE = {b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t"}


def decode_token(token: bytes) -> bytes:
    """What a reader shows for one escape, as UTF-8 (a percent-escape: its byte)."""
    lead = token[:1]
    if lead == b"%":
        return bytes([int(token[1:], 16)])
    if lead == b"&":
        return html.unescape(token.decode("ascii")).encode("utf-8", "replace")
    if token[1:2] != b"u":
        return _JSON_SIMPLE[token[1:2]]
    code = int(token[2:6], 16)
    if len(token) == 12:  # a surrogate pair
        code = 0x10000 + ((code - 0xD800) << 10) + (int(token[8:12], 16) - 0xDC00)
    elif 0xD800 <= code <= 0xDFFF:
        return REPLACEMENT  # a lone surrogate is no character a value can hold
    return chr(code).encode("utf-8")


_TOKEN_SPLIT = re.compile(b"(" + TOKEN.pattern + b")")
# A byte that is never inside an escape but its last byte (or, for % and &, only its first): a
# text can be cut just after it (just before a % or &) without cutting an escape.
_SAFE = re.compile(rb"[^0-9A-Za-z#\\]")
CHUNK = 64 * 1024  # decoded a piece at a time (bounded memory); a span maps back by a walk of one


class Layer:
    """One decoding of a text, piece by piece (each cut where no escape is, so the pieces decode
    as the whole would), with where each piece starts in both: a span is mapped back by a walk over
    the escapes of one piece."""

    def __init__(self, source: bytes, decoder: Decoder) -> None:
        self.source = source
        self.pieces: list[tuple[int, int]] = []  # (decoded start, original start), both rising
        out: list[bytes] = []
        decoded_at = 0
        for start, end in _pieces(source):
            self.pieces.append((decoded_at, start))
            piece = decoder.decode_piece(source[start:end])
            out.append(piece)
            decoded_at += len(piece)
        self.text = b"".join(out)
        self._decoder = decoder

    def original(self, position: int, is_end: bool) -> int:
        """The original offset of a decoded offset: of a span's start (``is_end`` False), or one past
        a span's last byte (``position`` is that last byte); inside an escape, the escape's start
        (for a start) or end (for an end)."""
        decoded_at, at = self.pieces[bisect.bisect_right(self.pieces, (position, 1 << 62)) - 1]
        shift = at - decoded_at
        for match in TOKEN.finditer(self.source, at):
            first, last = match.span()
            decoded_first = first - shift
            if position < decoded_first:
                break
            decoded_last = decoded_first + len(self._decoder.decoded(match.group()))
            if position < decoded_last:
                return last if is_end else first
            shift += (last - first) - (decoded_last - decoded_first)
        return position + shift + (1 if is_end else 0)

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the source a span of the decoded text came from, widened to whole escapes."""
        return self.original(start, False), self.original(end - 1, True)


def _pieces(source: bytes) -> Iterator[tuple[int, int]]:
    """``source`` cut in pieces of about :data:`CHUNK` bytes, never inside an escape."""
    start, size = 0, len(source)
    while start < size:
        target = start + CHUNK
        if target >= size:
            yield start, size
            return
        safe = _SAFE.search(source, target, target + CHUNK)
        if safe is not None:
            end = safe.start() if source[safe.start()] in b"%&" else safe.start() + 1
        else:
            end = _after_escape(source, start, target)
        yield start, end
        start = end


def _after_escape(source: bytes, start: int, target: int) -> int:
    """The first offset from ``target`` that is no escape's inside, found by reading the escapes
    from ``start`` (where none is cut): for a long run without a safe byte (all escapes, say)."""
    for match in TOKEN.finditer(source, start):
        if match.start() >= target:
            return target
        if match.end() >= target:
            return match.end()
    return target


class Decoder:
    """The decoding of one text, :data:`LAYERS` deep, with each distinct escape decoded once (pages
    repeat a few of them)."""

    def __init__(self) -> None:
        self.cache: dict[bytes, bytes] = {}

    def decoded(self, token: bytes) -> bytes:
        found = self.cache.get(token)
        if found is None:
            found = decode_token(token)
            if len(self.cache) < CACHE_MAX:
                self.cache[token] = found
        return found

    def decode_piece(self, piece: bytes) -> bytes:
        """A piece with its escapes decoded: one split in C, a lookup per escape."""
        parts = _TOKEN_SPLIT.split(piece)
        if len(parts) == 1:
            return piece
        get, decoded = self.cache.get, self.decoded
        parts[1::2] = [get(token) or decoded(token) for token in parts[1::2]]
        return b"".join(parts)

    def layers(self, data: bytes) -> list[Layer]:
        """Each layer decoded from ``data`` that differs from the one before (at most :data:`LAYERS`);
        empty when ``data`` holds no escape."""
        layers: list[Layer] = []
        text = data
        for _ in range(LAYERS):
            if not any(lead in text for lead in LEADS):
                break
            layer = Layer(text, self)
            if layer.text == text:
                break
            layers.append(layer)
            text = layer.text
        return layers


def original_span(layers: Sequence[Layer], depth: int, start: int, end: int) -> tuple[int, int]:
    """The span of the original text that a span of layer ``depth``'s decoded text came from."""
    for layer in reversed(layers[: depth + 1]):
        start, end = layer.original_span(start, end)
    return start, end


def find_all(haystack: bytes, needle: bytes) -> Iterator[tuple[int, int]]:
    """Every non-overlapping place of ``needle`` in ``haystack``."""
    at = haystack.find(needle)
    while at >= 0:
        yield at, at + len(needle)
        at = haystack.find(needle, at + len(needle))
