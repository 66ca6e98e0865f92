"""The gateway's rewrite of Chromium's /json answers: every DevTools address the gateway's."""

from __future__ import annotations

from corral.gateway.cdp import rewrite, ws_base

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
