"""The controller's link to Chromium: what DevTools names is followed only on its own address, and
the tabs keep their order across a new connection."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from corral.sandbox.web.browser import Browser, pinned_endpoint
from corral.sandbox.web.tabs import LastPage
from corral.sandbox.web.tabset import TabSet


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
    """A Playwright page as ``TabSet.pages`` sees it: open, with a Chromium target."""

    def __init__(self, target: str) -> None:
        self.target = target

    def is_closed(self) -> bool:
        return False


async def test_tabs_keep_their_order_across_a_new_connection() -> None:
    async def target_of(page: _Tab) -> str:
        return page.target

    listed: list[_Tab] = []

    async def connected() -> SimpleNamespace:
        return SimpleNamespace(contexts=[SimpleNamespace(pages=listed)])

    tabs = TabSet(connected, lambda context: None, target_of, LastPage(_no_targets))
    listed[:] = [_Tab("A"), _Tab("B")]
    assert [page.target for page in await tabs.pages()] == ["A", "B"]
    # After a driver restart the new connection lists the same targets the other way round (seen in CI):
    # the tabs come back in the order first seen, under the same ids, so an index names the same tab.
    tabs.forget()
    listed[:] = [_Tab("B"), _Tab("A")]
    again = await tabs.pages()
    assert [page.target for page in again] == ["A", "B"]
    assert [await tabs.tab_id(page) for page in again] == ["tab-1", "tab-2"]
    # A connection that drops mid-listing forgets every id: such a tab sorts last, and nothing raises.
    tabs.forget()
    assert tabs.seen_at(again[0]) > 10**9


async def _no_targets() -> list[object]:
    return []


class _Context:
    """A browser context that is told of a page only when the test says (Playwright's page event)."""

    def __init__(self) -> None:
        self.pages: list[_Tab] = []
        self.listeners: list[object] = []
        self.listening = asyncio.Event()

    def on(self, event: str, listener: object) -> None:
        assert event == "page"
        self.listeners.append(listener)
        self.listening.set()

    def remove_listener(self, event: str, listener: object) -> None:
        self.listeners.remove(listener)

    def told_of(self, page: _Tab) -> None:
        self.pages.append(page)
        for listener in list(self.listeners):
            listener(page)  # type: ignore[operator]


async def test_a_page_chromium_has_and_the_connection_was_not_told_of_yet_is_waited_for() -> None:
    """A CDP client closed the last page: Corral opened a blank tab (PUT /json/new) that the
    controller's own connection hears of a moment later; the agent's tab list waits for it."""
    context = _Context()

    async def connected() -> SimpleNamespace:
        return SimpleNamespace(contexts=[context])

    async def one_page() -> list[dict[str, str]]:
        return [{"id": "B1", "type": "page"}]

    async def target_of(page: _Tab) -> str:
        return page.target

    tabs = TabSet(connected, lambda context: None, target_of, LastPage(one_page))
    listing = asyncio.create_task(tabs.pages())
    await context.listening.wait()
    context.told_of(_Tab("B1"))
    assert [page.target for page in await listing] == ["B1"] and context.listeners == []


def test_the_browser_wires_its_tabs_to_its_own_connection() -> None:
    browser = Browser("http://127.0.0.1:9222")
    assert browser.last_page is browser.tabset.last_page
    assert browser.current_url() is None and not browser.connected and not browser.driver_running
