"""DevTools' HTTP answers, from a real socket on loopback that answers as Chromium does, or as whatever
the agent's uid may have put on its port does."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from corral.errors import ActionError
from corral.sandbox.web import devtools

VERSION = b'{"Browser": "Chrome/156", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/x"}'


@asynccontextmanager
async def answering(answer: Callable[[bytes], bytes | None], *, close: bool = False) -> AsyncIterator[str]:
    """A server on loopback answering each request's head with ``answer(head)`` (None: never)."""
    heads: list[bytes] = []
    done = asyncio.Event()  # set when the test is over: the connections are held open until then

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        reply = answer(head)
        if reply is None:
            await done.wait()
            return
        writer.write(reply)
        await writer.drain()
        if close:
            writer.close()
        else:
            await done.wait()  # keep-alive, as Chromium's server does: the length says where it ends

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        server.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )


async def test_an_answer_is_read_to_its_length_on_a_connection_kept_open() -> None:
    seen: list[bytes] = []

    def answer(head: bytes) -> bytes:
        seen.append(head)
        return ok(VERSION)

    async with answering(answer) as url:
        got = await devtools.get(url, "/json/version", 2.0)
    assert got.status == 200 and got.body == VERSION
    assert got.json()["webSocketDebuggerUrl"].endswith("/devtools/browser/x")
    assert seen[0].startswith(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_an_answer_without_a_length_runs_to_the_connections_end() -> None:
    async with answering(lambda _: b"HTTP/1.0 404 Not Found\r\n\r\nno such target", close=True) as url:
        got = await devtools.get(url, "/json/nothing", 2.0)
    assert (got.status, got.body) == (404, b"no such target")


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "IncompleteRead"),
        (b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 20_000 + b"\r\n\r\n", "LimitOverrun"),
    ],
)
async def test_anything_but_a_whole_well_formed_answer_is_an_error(reply: bytes, why: str) -> None:
    async with answering(lambda _: reply, close=True) as url:
        with pytest.raises(ActionError, match=why):
            await devtools.get(url, "/json/version", 2.0)


async def test_no_answer_is_an_error_at_the_timeout() -> None:
    async with answering(lambda _: None) as url:
        start = time.monotonic()
        with pytest.raises(ActionError, match=r"within 0\.3 s"):
            await devtools.get(url, "/json/list", 0.3)
    assert time.monotonic() - start < 2.0


async def test_nobody_listening_and_a_bad_address_are_errors() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(ActionError):
        await devtools.get(f"http://127.0.0.1:{port}", "/json/version", 2.0)
    with pytest.raises(ActionError, match="not a DevTools address"):
        await devtools.get("ws://127.0.0.1:9222", "/json/version", 2.0)


async def test_a_blank_tab_is_opened_with_put_as_chromium_asks() -> None:
    from corral.sandbox.web.tabs import open_blank

    seen: list[bytes] = []

    def answer(head: bytes) -> bytes:
        seen.append(head)
        return ok(b'{"id": "B1", "type": "page", "url": "about:blank"}')

    async with answering(answer) as url:
        await open_blank(url)
    assert seen[0].startswith(b"PUT /json/new?about:blank HTTP/1.1\r\n")
    async with answering(lambda _: b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n") as url:
        with pytest.raises(ActionError, match="did not open a tab"):
            await open_blank(url)
    with pytest.raises(ActionError):
        await devtools.get("http://127.0.0.1:9222", "/json/close/X", 1.0, method="DELETE")
