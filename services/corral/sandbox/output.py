"""What a process printed, kept two ways, and how it goes on the wire. Pure: no I/O.

- :class:`Capture`: the first ``limit`` bytes of a stream and whether more came (an ``exec``'s
  result: ``stdout``/``stderr`` with ``*_truncated``);
- :class:`Ring`: the last ``capacity`` bytes, addressed by offsets since the start, so a reader
  can resume where it stopped and learns how much was dropped before it (``process_output``);
- :func:`render`: bytes as the reply's text, UTF-8 (invalid bytes replaced) or base64;
  :func:`fit` the longest prefix whose JSON text stays within a budget (a reply must fit its frame);
  :class:`StreamDecoder` the same for a stream cut into chunks (a character split across two
  chunks is not replaced).
"""

from __future__ import annotations

import base64
import codecs
import json
from dataclasses import dataclass, field
from typing import Literal

Encoding = Literal["utf-8", "base64"]


def render(data: bytes, encoding: Encoding) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8", errors="replace")


def json_size(text: str) -> int:
    """The bytes ``text`` takes in a reply, as :func:`corral.protocol.reply.encode` writes it
    (ASCII JSON: a control byte is six, a replaced byte ``\\ufffd`` six, base64 one each)."""
    return len(json.dumps(text))


def fit(data: bytes, encoding: Encoding, budget: int) -> tuple[str, int]:
    """The text of the longest prefix of ``data`` whose JSON takes at most ``budget`` bytes, and how
    many bytes of ``data`` it holds (a UTF-8 character is never split at the cut)."""
    if encoding == "base64":
        used = min(len(data), max(0, budget - 2) // 4 * 3)
        return render(data[:used], "base64"), used
    text, used = render(data, encoding), len(data)
    while json_size(text) > budget and used > 0:
        used = max(0, min(used - 1, used * budget // json_size(text) - 4))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data[:used], False)
        used -= len(decoder.getstate()[0])  # an unfinished character at the cut stays out
    return text, used


class StreamDecoder:
    """Chunks of one stream to text, carrying a split UTF-8 sequence over to the next chunk."""

    def __init__(self, encoding: Encoding) -> None:
        self._encoding = encoding
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> str:
        if self._encoding == "base64":
            return render(data, "base64")
        return self._utf8.decode(data, final)


@dataclass
class Capture:
    """The first ``limit`` bytes of a stream; ``truncated`` once anything beyond them arrived."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(0, room)]
        self.data += chunk


@dataclass(frozen=True, slots=True)
class Slice:
    """What :meth:`Ring.read` found: the bytes from ``offset`` (moved up to the oldest kept one if
    the asked offset was dropped), how many asked-for bytes were dropped, and where to go on."""

    data: bytes
    offset: int
    dropped: int
    next_offset: int


class Ring:
    """The last ``capacity`` bytes of a stream, addressed by their offset since the stream began."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one byte")
        self.capacity = capacity
        self._buffer = bytearray()
        self._start = 0  # the offset of _buffer[0]

    @property
    def end(self) -> int:
        """The offset just past the last byte written (bytes written so far)."""
        return self._start + len(self._buffer)

    @property
    def start(self) -> int:
        """The oldest offset still kept."""
        return self._start

    def append(self, chunk: bytes) -> None:
        if len(chunk) >= self.capacity:
            self._start += len(self._buffer) + len(chunk) - self.capacity
            self._buffer = bytearray(chunk[-self.capacity :])
            return
        self._buffer += chunk
        excess = len(self._buffer) - self.capacity
        if excess > 0:
            del self._buffer[:excess]
            self._start += excess

    def read(self, offset: int, max_bytes: int) -> Slice:
        offset = min(offset, self.end)
        dropped = max(0, self._start - offset)
        begin = max(offset, self._start)
        data = bytes(self._buffer[begin - self._start : begin - self._start + max_bytes])
        return Slice(data, begin, dropped, begin + len(data))
