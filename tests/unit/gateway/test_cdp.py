"""The gateway's side of CDP: its rewrite of Chromium's /json answers (every DevTools address the
gateway's) and its relay (a command over the cap not sent on, the controller's close code passed on)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.contracts.cdprules import CDP_MAX_COMMAND_BYTES
from corral.gateway.cdp import relay, rewrite, ws_base

VERSION = {
    "Browser": "Chrome/131.0.6778.204",
    "Protocol-Version": "1.3",
    "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/1f2e",
}
LIST = [
    {
        "id": "A1B2",
        "type": "page",
        "url": "about:blank",
        "devtoolsFrontendUrl": "/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/A1B2",
        "devtoolsFrontendUrlCompat": "/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/A1B2",
        "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/page/A1B2",
    },
    {"id": "C3", "type": "other", "url": ""},
]


def test_the_browser_socket_is_the_gateways() -> None:
    base = ws_base("http", "gw.example:8700", "s-1")
    assert base == "ws://gw.example:8700/v1/sessions/s-1/cdp"
    assert rewrite(VERSION, base) == {**VERSION, "webSocketDebuggerUrl": base}


def test_pages_get_their_own_path_and_no_front_end() -> None:
    base = ws_base("https", "gw.example", "s-1", ticket="abc.def")
    assert base == "wss://gw.example/v1/sessions/s-1/cdp/t/abc.def"
    page, other = rewrite(LIST, base)
    assert page == {"id": "A1B2", "type": "page", "url": "about:blank", "webSocketDebuggerUrl": f"{base}/page/A1B2"}
    assert other == LIST[1]


def test_anything_else_passes_unchanged() -> None:
    assert rewrite("text", "ws://x") == "text"
    assert rewrite([1, "a"], "ws://x") == [1, "a"]


class Client:
    """The client's socket: what it sends, then nothing; how it was closed."""

    def __init__(self, frames: list[str]) -> None:
        self._frames = [{"type": "websocket.receive", "text": f} for f in frames]
        self.closed: tuple[int, str] | None = None
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self._frames:
            return self._frames.pop(0)
        await self.done.wait()
        return {"type": "websocket.disconnect"}

    async def send_text(self, text: str) -> None:
        return None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


class Controller:
    """The controller's socket: what reached it; it closes with ``code`` after ``after`` frames."""

    def __init__(self, after: int, code: int | None, reason: str = "") -> None:
        self.received: list[str | bytes] = []
        self._after, self.close_code, self.close_reason = after, None, ""
        self._code, self._reason = code, reason
        self._closed = asyncio.Event()

    async def send(self, frame: str | bytes) -> None:
        self.received.append(frame)
        if len(self.received) >= self._after:
            self.close_code, self.close_reason = self._code, self._reason
            self._closed.set()

    def __aiter__(self) -> Controller:
        return self

    async def __anext__(self) -> str:
        await self._closed.wait()
        raise StopAsyncIteration

    async def close(self) -> None:
        return None


class Session:
    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def touch(self) -> None:
        return None


async def test_a_command_over_the_cap_is_not_sent_on_and_closes_1009() -> None:
    client = Client(['{"id":1}', "x" * (CDP_MAX_COMMAND_BYTES + 1)])
    controller = Controller(after=99, code=None)
    await relay(client, controller, Session())  # type: ignore[arg-type]
    assert controller.received == ['{"id":1}'] and client.closed is not None and client.closed[0] == 1009


@pytest.mark.parametrize(("code", "passed"), [(1009, 1009), (1011, 1011), (None, 1000), (1006, 1000), (1005, 1000)])
async def test_the_controllers_close_code_is_passed_on(code: int | None, passed: int) -> None:
    client = Client(['{"id":1}'])
    await relay(client, Controller(after=1, code=code, reason="why"), Session())  # type: ignore[arg-type]
    assert client.closed is not None and client.closed[0] == passed
