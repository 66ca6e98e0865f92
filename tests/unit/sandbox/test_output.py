"""Rings, captures and how output is rendered: pure."""

from __future__ import annotations

import base64

import pytest

from corral.sandbox.output import Capture, Encoding, Ring, StreamDecoder, fit, json_size, render


def test_a_capture_keeps_the_first_bytes_and_says_when_more_came() -> None:
    capture = Capture(5)
    capture.add(b"abc")
    capture.add(b"de")
    assert (bytes(capture.data), capture.truncated) == (b"abcde", False)  # exactly the limit is not truncated
    capture.add(b"f")
    assert (bytes(capture.data), capture.truncated) == (b"abcde", True)
    empty = Capture(0)
    empty.add(b"x")
    assert (bytes(empty.data), empty.truncated) == (b"", True)


def test_a_ring_is_read_by_offsets_since_the_start() -> None:
    ring = Ring(8)
    ring.append(b"0123")
    ring.append(b"4567")
    assert (ring.start, ring.end) == (0, 8)
    part = ring.read(2, 3)
    assert (part.data, part.offset, part.next_offset, part.dropped) == (b"234", 2, 5, 0)
    ring.append(b"89")  # 0 and 1 drop out
    assert (ring.start, ring.end) == (2, 10)
    late = ring.read(0, 100)
    assert (late.data, late.offset, late.dropped, late.next_offset) == (b"23456789", 2, 2, 10)
    beyond = ring.read(99, 5)
    assert (beyond.data, beyond.offset, beyond.next_offset) == (b"", 10, 10)


def test_a_chunk_larger_than_the_ring_keeps_its_tail() -> None:
    ring = Ring(4)
    ring.append(b"ab")
    ring.append(b"cdefgh")
    assert (ring.start, ring.end, ring.read(0, 10).data) == (4, 8, b"efgh")
    with pytest.raises(ValueError):
        Ring(0)


def test_render_replaces_or_keeps_bytes() -> None:
    assert render(b"a\xffb", "utf-8") == "a\ufffdb"
    assert base64.b64decode(render(b"a\xffb", "base64")) == b"a\xffb"


def test_a_character_split_across_chunks_survives_streaming() -> None:
    decoder = StreamDecoder("utf-8")
    euro = "€".encode()
    assert decoder.feed(b"x" + euro[:1]) == "x"
    assert decoder.feed(euro[1:] + b"y") == "€y"
    assert decoder.feed(b"\xe2", final=True) == "\ufffd"
    assert StreamDecoder("base64").feed(b"\xff") == "/w=="


@pytest.mark.parametrize("data", [b"\x00" * 5000, "é".encode() * 2000, b"plain" * 1000, bytes(range(256)) * 20])
@pytest.mark.parametrize("encoding", ["utf-8", "base64"])
def test_fit_keeps_the_longest_prefix_whose_json_is_within_the_budget(data: bytes, encoding: Encoding) -> None:
    text, used = fit(data, encoding, 1000)
    assert json_size(text) <= 1000
    assert 0 < used < len(data)
    assert text == render(data[:used], encoding)  # no character split at the cut
    whole, all_of_it = fit(data, encoding, 10 * json_size(render(data, encoding)))
    assert (whole, all_of_it) == (render(data, encoding), len(data))


def test_json_size_counts_escapes_as_the_reply_writes_them() -> None:
    assert json_size("a") == 3
    assert json_size("\x00") == 8  # "\u0000"
    assert json_size("\ufffd") == 8
