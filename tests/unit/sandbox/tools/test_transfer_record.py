"""A download's body counted and hashed as it is sent, and recorded once however it ends."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest

from corral.sandbox.tools.transfer_record import Tallied


async def _chunks(*parts: bytes, fail: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if fail:
        raise OSError("tar failed")


class Ends:
    def __init__(self) -> None:
        self.seen: list[tuple[int, str, str | None]] = []

    def __call__(self, size: int, sha256: str, why_cut: str | None) -> None:
        self.seen.append((size, sha256, why_cut))


async def test_a_whole_stream_is_recorded_once_with_its_size_and_sha256() -> None:
    ends = Ends()
    body = Tallied(_chunks(b"ab", b"cde"), ends)
    assert [chunk async for chunk in body] == [b"ab", b"cde"]
    await body.aclose()  # the server closing it afterwards records nothing more
    assert ends.seen == [(5, hashlib.sha256(b"abcde").hexdigest(), None)]


async def test_a_stream_that_fails_or_is_closed_early_is_recorded_as_cut() -> None:
    failed = Ends()
    body = Tallied(_chunks(b"ab", fail=True), failed)
    with pytest.raises(OSError):
        async for _ in body:
            pass
    assert failed.seen == [(2, hashlib.sha256(b"ab").hexdigest(), "the stream stopped: OSError")]
    left = Ends()
    early = Tallied(_chunks(b"ab", b"cd"), left)
    assert await anext(early) == b"ab"
    await early.aclose()  # the client went away
    assert left.seen == [(2, hashlib.sha256(b"ab").hexdigest(), "the stream was closed before its end")]


async def test_a_cancelled_send_is_recorded_as_cut() -> None:
    gate, waiting = asyncio.Event(), asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"x"
        waiting.set()
        await gate.wait()
        yield b"y"

    ends = Ends()
    body = Tallied(slow(), ends)
    assert await anext(body) == b"x"
    task = asyncio.ensure_future(anext(body))
    await waiting.wait()  # the send is waiting for the next chunk when the client leaves
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ends.seen == [(1, hashlib.sha256(b"x").hexdigest(), "the stream stopped: CancelledError")]
