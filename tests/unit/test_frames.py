"""A WebSocket client's next frame as it came, and its size in UTF-8 bytes against a limit."""

from __future__ import annotations

from starlette.types import Message
from starlette.websockets import WebSocket

from corral.frames import next_frame, over_limit


async def _accepted(*messages: Message) -> WebSocket:
    """A server's side of a WebSocket, accepted, whose client then sends ``messages``."""
    incoming: list[Message] = [{"type": "websocket.connect"}, *messages]

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        return None

    websocket = WebSocket({"type": "websocket", "path": "/", "headers": []}, receive, send)
    await websocket.accept()
    return websocket


async def test_a_text_frame_comes_as_text_and_a_binary_one_as_bytes() -> None:
    websocket = await _accepted(
        {"type": "websocket.receive", "text": "{}"},
        {"type": "websocket.receive", "bytes": b"\x00\x01"},
        {"type": "websocket.receive", "text": ""},
    )

    assert [await next_frame(websocket) for _ in range(3)] == ["{}", b"\x00\x01", ""]


async def test_a_client_gone_is_none() -> None:
    websocket = await _accepted({"type": "websocket.disconnect", "code": 1000})

    assert await next_frame(websocket) is None


def test_a_frame_at_the_limit_is_not_over_it_and_one_byte_more_is() -> None:
    assert not over_limit(b"x" * 8, 8) and over_limit(b"x" * 9, 8)
    assert not over_limit("x" * 8, 8) and over_limit("x" * 9, 8)


def test_a_text_counts_its_utf8_bytes_not_its_characters() -> None:
    assert not over_limit("é" * 4, 8)
    assert over_limit("é" * 5, 8)  # 5 characters, 10 bytes
    assert over_limit("€" * 3, 8)  # 3 characters, 9 bytes
