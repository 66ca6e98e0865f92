"""Browser actions through Playwright over CDP: navigation, history, tabs; and the clipboard."""

from __future__ import annotations

from corral.client import SandboxClient

from .conftest import await_title, html_url
from .test_input import focus_input

BLUE = (0, 0, 255)


def _page(name: str) -> str:
    return html_url(f"<h1>{name}</h1>", f"document.title = {name!r};")


def test_navigate_back_forward_reload(client: SandboxClient) -> None:
    one = client.act({"type": "navigate", "url": _page("one")})["result"]
    assert one["title"] == "one"
    client.act({"type": "navigate", "url": _page("two"), "wait_until": "domcontentloaded"})
    assert client.act({"type": "back"})["result"]["title"] == "one"
    assert client.act({"type": "forward"})["result"]["title"] == "two"
    assert client.act({"type": "reload"})["result"]["title"] == "two"
    info = client.act({"type": "page_info"})["result"]
    assert info["url"] == _page("two") and info["title"] == "two"


def test_navigation_failure_is_structured(client: SandboxClient) -> None:
    reply = client.request({"action": {"type": "navigate", "url": "http://corral-nowhere.invalid/"}})
    assert reply["ok"] is False
    assert reply["error"]["code"] == "navigation_failed" and reply["error"]["field"] == "action.url"


def test_tabs_new_switch_close(client: SandboxClient) -> None:
    client.act({"type": "navigate", "url": _page("first")})
    created = client.act({"type": "tab_new", "url": _page("second")})["result"]
    assert created["title"] == "second"
    tabs = client.act({"type": "tabs"})["result"]["tabs"]
    assert [t["title"] for t in tabs][-2:] == ["first", "second"]
    assert [t["active"] for t in tabs].count(True) == 1 and tabs[-1]["active"]
    first = tabs[-2]["id"]
    assert client.act({"type": "tab_switch", "tab": first})["result"]["title"] == "first"
    assert client.act({"type": "page_info"})["result"]["title"] == "first"
    closed = client.act({"type": "tab_close", "tab": created["id"]})["result"]
    assert closed["closed"] == created["id"]
    assert all(t["id"] != created["id"] for t in client.act({"type": "tabs"})["result"]["tabs"])
    reply = client.request({"action": {"type": "tab_switch", "tab": "tab-9999"}})
    assert reply["error"]["code"] == "no_such_tab"


def test_clipboard_round_trip_and_paste(client: SandboxClient) -> None:
    text = "clipboard ✓ 剪贴板"
    client.act({"type": "clipboard_set", "text": text})
    assert client.act({"type": "clipboard_get"})["result"]["text"] == text
    focus_input(client)
    client.act({"type": "key", "keys": "ctrl+v"})
    assert await_title(client, text) == text
