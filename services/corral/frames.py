"""WebSocket frames shared by the gateway and the controller: a client's next frame, and its size
against a channel's limit (uvicorn takes CDP's larger frames on every route, corral.contracts.cdprules,
so each channel keeps its own)."""

from __future__ import annotations

from starlette.websockets import WebSocket


async def next_frame(websocket: WebSocket) -> str | bytes | None:
    """The client's next frame as it came (a text frame as text, a binary one as bytes), or None
    once the client has gone."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text: str | None = message.get("text")
    if text is not None:
        return text
    data: bytes | None = message.get("bytes")
    return data or b""


def over_limit(frame: str | bytes, limit: int) -> bool:
    """Whether ``frame`` is over ``limit`` bytes (a text as its UTF-8)."""
    # A character is at most 4 bytes of UTF-8: only a text that may be over ``limit`` is encoded.
    if isinstance(frame, str) and len(frame) * 4 > limit:
        return len(frame.encode()) > limit
    return len(frame) > limit
