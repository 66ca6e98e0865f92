"""Chromium's DevTools HTTP endpoint (``GET /json/version``, ``/json/list``, ``PUT /json/new``): one HTTP/1.1 request on
a loopback connection, its answer read whole, bounded in size and time.

Not httpx: the controller asks DevTools for a few hundred bytes of JSON, and httpx's import is about
3 MiB of every idle sandbox's memory (bench/gateway.py). What answers on that port may be anything the
agent's uid started (it can kill Chromium and listen there before it comes back), so an answer is
only taken whole and well formed; anything else is an ActionError (browser_unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from corral.errors import ActionError, ErrorCode

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 8 << 20  # /json/list of a hundred tabs is tens of KiB
_METHODS = frozenset({"GET", "PUT"})


def _unavailable(message: str) -> ActionError:
    return ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium's DevTools: {message}")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The body as JSON; raises ValueError if it is not."""
        return json.loads(self.body)


async def get(base_url: str, path: str, timeout_s: float, method: str = "GET") -> Answer:
    """``GET path`` (or ``method``: /json/new takes PUT only) on ``base_url`` (``http://host:port``);
    raises ActionError (browser_unavailable)."""
    address = urllib.parse.urlsplit(base_url)
    host, port = address.hostname, address.port
    if address.scheme != "http" or not host or port is None or not path.startswith("/") or method not in _METHODS:
        raise _unavailable(f"not a DevTools address and path: {base_url!r} {path!r}")
    request = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: application/json\r\n\r\n"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
            try:
                writer.write(request.encode("ascii"))
                await writer.drain()
                return await _answer(reader)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        raise _unavailable(f"no answer to {path} within {timeout_s} s") from None
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise _unavailable(f"the answer to {path}: {exc!r}") from None


async def _answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status, length = parse_head(head)
    if length is None:  # no length given: the body runs to the end of the connection
        body = b""
        while len(body) <= MAX_BODY_BYTES and (more := await reader.read(MAX_BODY_BYTES + 1 - len(body))):
            body += more
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"a body over {MAX_BODY_BYTES} bytes")
        return Answer(status, body)
    return Answer(status, await reader.readexactly(length))


def parse_head(head: bytes) -> tuple[int, int | None]:
    """The status and the Content-Length (None when not given) of an answer's head; raises ValueError."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == "transfer-encoding":
            raise ValueError(f"a {value} body (DevTools gives a length)")
        if name == "content-length":
            if not value.isdigit() or int(value) > MAX_BODY_BYTES or (length is not None and int(value) != length):
                raise ValueError(f"Content-Length {value[:40]!r}")
            length = int(value)
    return int(code), length
