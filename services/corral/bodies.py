"""HTTP bodies shared by the gateway and the controller: a request's read with a cap, and a streamed
answer that frees what it streams from however it ends."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The body, or None once it is known to exceed ``limit`` bytes (the rest is not buffered)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class ClosingStream(StreamingResponse):
    """A streamed answer whose source is closed (``close`` awaited) however it ends: sent whole, the
    client gone mid-way, or gone before the first byte, when Starlette never iterates the body at
    all (a background task would run in the first case only)."""

    def __init__(self, content: AsyncIterable[bytes], close: Callable[[], Awaitable[None]], **options: Any) -> None:
        super().__init__(content, **options)
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()
