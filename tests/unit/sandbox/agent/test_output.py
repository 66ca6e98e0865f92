"""Rings, captures and how output is rendered: pure."""

from __future__ import annotations

import base64

import pytest

from corral.sandbox.agent.output import Budget, Capture, Encoding, Ring, RingPool, StreamDecoder, fit, json_size, render


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


def test_rings_in_a_pool_share_one_budget_and_finished_ones_give_first() -> None:
    pool = RingPool(10)
    done, busy = pool.ring(8), pool.ring(8)
    done.append(b"012345")
    done.finished = True
    busy.append(b"abcdef")  # 12 held: the finished ring gives up its two oldest
    assert (pool.held, len(done), len(busy)) == (10, 4, 6)
    assert done.read(0, 10).dropped == 2
    busy.append(b"ghijkl")  # over its own capacity (8), then the pool's: done gives again
    assert (pool.held, len(done), busy.read(0, 99).data) == (10, 2, b"efghijkl")
    pool.release(busy)
    assert pool.held == 2
    pool.release(done)
    assert pool.held == 0


def test_rings_still_written_give_from_the_largest() -> None:
    pool = RingPool(10)
    small, large = pool.ring(100), pool.ring(100)
    small.append(b"ab")
    large.append(b"0123456789")
    assert (pool.held, len(small), len(large)) == (10, 2, 8)


def test_captures_share_a_budget_and_say_when_it_cut_them() -> None:
    budget = Budget(5)
    first, second = Capture(4, budget), Capture(4, budget)
    first.add(b"abc")
    second.add(b"defg")
    assert (bytes(first.data), first.truncated, bytes(second.data), second.truncated) == (b"abc", False, b"de", True)
    first.release()
    assert budget.held == 2


def test_an_emptied_finished_ring_is_not_taken_from_again() -> None:
    pool = RingPool(10)
    done, busy = pool.ring(8), pool.ring(20)
    done.append(b"01")
    done.finished = True
    busy.append(b"abcdefgh")
    busy.append(b"ijklmn")  # 16 held: done gives its 2, then busy its oldest
    assert (pool.held, len(done), len(busy)) == (10, 0, 10)
    busy.append(b"o")
    assert (pool.held, len(busy)) == (10, 10)
