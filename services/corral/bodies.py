"""Reading an HTTP request body with a cap, shared by the gateway and the controller."""

from __future__ import annotations

from starlette.requests import Request


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
