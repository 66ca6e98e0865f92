"""What a process printed, kept two ways, and how it goes on the wire. Pure: no I/O.

- :class:`Capture`: the first ``limit`` bytes of a stream and whether more came (an ``exec``'s
  result: ``stdout``/``stderr`` with ``*_truncated``);
- :class:`Ring`: the last ``capacity`` bytes, addressed by offsets since the start, so a reader
  can resume where it stopped and learns how much was dropped before it (``process_output``);
- :class:`RingPool` and :class:`Budget`: one byte budget for all the rings, one for all the
  captures, so no number of processes makes the controller hold more than those;
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


class Budget:
    """Bytes shared by many holders: each takes what is left (maybe less than it asked) and gives
    it back when done."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, wanted: int) -> int:
        granted = max(0, min(wanted, self.limit - self.held))
        self.held += granted
        return granted

    def give(self, amount: int) -> None:
        self.held -= amount


@dataclass
class Capture:
    """The first ``limit`` bytes of a stream (fewer if ``budget`` runs out); ``truncated`` once
    anything beyond what it kept arrived."""

    limit: int
    budget: Budget | None = None
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = max(0, min(len(chunk), self.limit - len(self.data)))
        if self.budget is not None:
            room = self.budget.take(room)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[:room]
        self.data += chunk

    def release(self) -> None:
        """Its bytes back to the budget (the capture is not added to again)."""
        if self.budget is not None:
            self.budget.give(len(self.data))
            self.budget = None


@dataclass(frozen=True, slots=True)
class Slice:
    """What :meth:`Ring.read` found: the bytes from ``offset`` (moved up to the oldest kept one if
    the asked offset was dropped), how many asked-for bytes were dropped, and where to go on."""

    data: bytes
    offset: int
    dropped: int
    next_offset: int


class Ring:
    """The last ``capacity`` bytes of a stream, addressed by their offset since the stream began.
    In a :class:`RingPool` it may keep fewer: the pool takes the oldest when its budget is spent."""

    def __init__(self, capacity: int, pool: RingPool | None = None) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one byte")
        self.capacity = capacity
        self.pool = pool
        self.finished = False  # no more to come: the pool takes from finished rings first
        self._buffer = bytearray()
        self._start = 0  # the offset of _buffer[0]

    def __len__(self) -> int:
        return len(self._buffer)

    @property
    def end(self) -> int:
        """The offset just past the last byte written (bytes written so far)."""
        return self._start + len(self._buffer)

    @property
    def start(self) -> int:
        """The oldest offset still kept."""
        return self._start

    def append(self, chunk: bytes) -> None:
        before = len(self._buffer)
        if len(chunk) >= self.capacity:
            self._start += len(self._buffer) + len(chunk) - self.capacity
            self._buffer = bytearray(chunk[-self.capacity :])
        else:
            self._buffer += chunk
            excess = len(self._buffer) - self.capacity
            if excess > 0:
                del self._buffer[:excess]
                self._start += excess
        if self.pool is not None:
            self.pool.grew(len(self._buffer) - before)

    def drop(self, count: int) -> None:
        """The oldest ``count`` bytes go (a reader is then told they were ``dropped``)."""
        count = min(count, len(self._buffer))
        if count <= 0:
            return
        del self._buffer[:count]
        self._start += count
        if self.pool is not None:
            self.pool.held -= count

    def read(self, offset: int, max_bytes: int) -> Slice:
        offset = min(offset, self.end)
        dropped = max(0, self._start - offset)
        begin = max(offset, self._start)
        data = bytes(self._buffer[begin - self._start : begin - self._start + max_bytes])
        return Slice(data, begin, dropped, begin + len(data))


class RingPool:
    """One byte budget for many rings: past ``limit``, the rings that hold the most give up their
    oldest bytes, finished ones (whose process ended) before those still written to."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._rings: dict[int, Ring] = {}

    def ring(self, capacity: int) -> Ring:
        ring = Ring(capacity, self)
        self._rings[id(ring)] = ring
        return ring

    def release(self, ring: Ring) -> None:
        """A ring no one reads any more: its bytes go back to the pool."""
        if self._rings.pop(id(ring), None) is not None:
            ring.drop(len(ring))
            ring.pool = None

    def grew(self, amount: int) -> None:
        self.held += amount
        while self.held > self.limit:
            victim = max(self._rings.values(), key=lambda ring: (ring.finished and len(ring) > 0, len(ring)))
            # A little more than the excess: the next appends fit without another search.
            victim.drop(self.held - self.limit + self.limit // 16)
