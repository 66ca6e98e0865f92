"""A stream's close with a bound (corral.streams)."""

from __future__ import annotations

import asyncio

from corral.streams import CLOSE_WAIT_S, closed


async def test_a_peer_that_stops_reading_does_not_hold_a_close() -> None:
    """A peer that never reads (the agent's own server under an upload through the preview door, a
    preview's client) keeps the socket's buffer full, and ``wait_closed`` alone waited for ever (the
    controller's shutdown with it). Past CLOSE_WAIT_S the transport is aborted."""
    held: list[asyncio.StreamWriter] = []

    async def never_reads(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x" * (64 << 20))  # far more than both sockets' buffers hold
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(CLOSE_WAIT_S + 5):
            await closed(writer)
        assert asyncio.get_running_loop().time() - started >= CLOSE_WAIT_S * 0.9  # it did wait, then dropped
        assert writer.transport.is_closing()
    finally:
        for peer in held:
            peer.transport.abort()
        server.close()
        await server.wait_closed()


async def test_a_close_that_drains_is_not_held() -> None:
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"hello")
        started = asyncio.get_running_loop().time()
        await closed(writer)
        assert asyncio.get_running_loop().time() - started < CLOSE_WAIT_S
    finally:
        server.close()
        await server.wait_closed()
