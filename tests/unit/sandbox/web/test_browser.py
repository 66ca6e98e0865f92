"""The controller's link to Chromium: what DevTools names is followed only on its own address, and
the tabs keep their order across a new connection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corral.sandbox.web import browser as browser_module
from corral.sandbox.web.browser import Browser, pinned_endpoint


@pytest.mark.parametrize(
    "named",
    [
        "ws://127.0.0.1:8765/v1/ws",  # the controller's own port
        "ws://corral-proxy:8081/",  # the proxy's control port
        "ws://127.0.0.1:9222/v1/ws",
        "wss://127.0.0.1:9222/devtools/browser/abc",
        "ws://localhost:9222/devtools/browser/abc",
        "ws://127.0.0.1:9222/devtools/browser/abc?x=1",
        "ws://u:p@127.0.0.1:9222/devtools/browser/abc",
        "ws://127.0.0.1:9222/devtools/browser/../../v1",
        None,
        42,
    ],
)
def test_a_browser_endpoint_off_the_devtools_address_is_refused(named: object) -> None:
    assert pinned_endpoint("http://127.0.0.1:9222", named) is None


def test_chromiums_own_endpoint_is_kept() -> None:
    named = "ws://127.0.0.1:9222/devtools/browser/0f4c3a9e-2b1d-4c55-9a7e-6f0e1d2c3b4a"
    assert pinned_endpoint("http://127.0.0.1:9222", named) == named


class _Tab:
    """A Playwright page as ``Browser._pages`` sees it: open, with a Chromium target."""

    def __init__(self, target: str) -> None:
        self.target = target

    def is_closed(self) -> bool:
        return False


async def test_tabs_keep_their_order_across_a_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    async def target_of(page: _Tab) -> str:
        return page.target

    monkeypatch.setattr(browser_module, "_target_id", target_of)
    browser = Browser("http://127.0.0.1:9222")
    listed: list[_Tab] = []

    async def connected() -> SimpleNamespace:
        return SimpleNamespace(contexts=[SimpleNamespace(pages=listed)])

    monkeypatch.setattr(browser, "connect", connected)
    listed[:] = [_Tab("A"), _Tab("B")]
    assert [page.target for page in await browser._pages()] == ["A", "B"]
    # After a driver restart the new connection lists the same targets the other way round (seen in CI):
    # the tabs come back in the order first seen, under the same ids, so an index names the same tab.
    browser._ids.clear()
    listed[:] = [_Tab("B"), _Tab("A")]
    again = await browser._pages()
    assert [page.target for page in again] == ["A", "B"]
    assert [await browser._tab_id(page) for page in again] == ["tab-1", "tab-2"]
    # A connection that drops mid-listing forgets every id: such a tab sorts last, and nothing raises.
    browser._ids.clear()
    assert browser._seen_at(again[0]) > 10**9
