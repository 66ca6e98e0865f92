"""Chromium through Playwright over CDP: navigation, page info and tabs, one facade over the rooms
that do the work:

- :mod:`~corral.sandbox.web.driver`: the connection and its driver, started on first need and stopped
  when idle;
- :mod:`~corral.sandbox.web.tabset`: the tabs' ids and order, the active one, the tab actions;
- :mod:`~corral.sandbox.web.navigation`: navigation and what a tab shows;
- :mod:`~corral.sandbox.web.inflight`: the page requests in flight (whether a page still loads).

The init restarts Chromium when it dies; the connection is then dropped and
made again on the next call, so a browser crash costs one failed action at most.

Chromium and its tabs are not the driver's, so they stay as they are across an idle stop. What can
be read without the driver (the active tab's URL and title, for the recording) is read from
DevTools' ``/json/list`` instead (:meth:`Browser.info_at_hand`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from playwright._impl._errors import Error as PlaywrightError

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web import devtools, navigation
from corral.sandbox.web.downloadbook import DownloadBook
from corral.sandbox.web.driver import Driver, pinned_endpoint
from corral.sandbox.web.inflight import InFlight
from corral.sandbox.web.navigation import Navigated, PageInfo
from corral.sandbox.web.tabs import LastPage, open_blank, page_targets
from corral.sandbox.web.tabset import TabClosed, TabList, TabSet, TabShown

if TYPE_CHECKING:
    from playwright.async_api import Browser as PWBrowser
    from playwright.async_api import Page

__all__ = ["AtHand", "Browser", "pinned_endpoint"]


class AtHand(TypedDict, total=False):
    """The active tab's URL and title as far as they can be read without the driver (empty: not at all)."""

    url: str | None
    title: str


class Browser:
    """One Playwright connection to the sandbox's Chromium, made lazily and remade after a restart;
    its driver stopped after ``idle_stop_s`` unused (0: never), unless ``busy()`` says an action runs."""

    def __init__(
        self,
        cdp_url: str,
        connect_timeout_s: float = 10.0,
        idle_stop_s: float = 0.0,
        busy: Callable[[], bool] = lambda: False,
        stopped: Callable[[], None] = lambda: None,
        downloads: DownloadBook | None = None,
    ) -> None:
        self._cdp_url = cdp_url
        # Every download of the session (corral.sandbox.web.downloadwatch fills it): a navigation to
        # an attachment answers with its download.
        self.downloads = downloads or DownloadBook()
        self._requests = InFlight()
        self._driver = Driver(
            cdp_url,
            connect_timeout_s=connect_timeout_s,
            idle_stop_s=idle_stop_s,
            busy=busy,
            stopped=stopped,
            on_connected=self._connected,
            on_lost=self._lost,
        )
        # Shared with the CDP relays: a native close and a CDP close at once cannot close the last two.
        last_page = LastPage(functools.partial(page_targets, cdp_url), functools.partial(open_blank, cdp_url))
        self.tabset = TabSet(self._driver.connect, self._requests.track, _target_id, last_page)

    def _connected(self, browser: PWBrowser) -> None:
        for context in browser.contexts:
            self._requests.track(context)
        self.tabset.forget()

    def _lost(self) -> None:
        self.tabset.forget()
        self._requests.clear()

    @property
    def last_page(self) -> LastPage:
        return self.tabset.last_page

    @property
    def stops(self) -> int:
        """Idle stops of the driver so far (for tests and logs)."""
        return self._driver.stops

    @property
    def connected(self) -> bool:
        return self._driver.connected

    @property
    def driver_running(self) -> bool:
        return self._driver.running

    async def devtools_answer(self) -> bool:
        """Whether Chromium's DevTools endpoint answers (readiness; the Playwright link may still be forming)."""
        return await self._driver.devtools_answer()

    def wanted(self) -> None:
        """An action that may make the page load (a click, a key) is running: start the driver in the
        background if it is stopped, so the settle after it and the next ones see the page's requests
        (:meth:`loading`). Nothing waits for it; a failure shows at the next browser call."""
        self._driver.wanted()

    async def connect(self) -> PWBrowser:
        return await self._driver.connect()

    def loading(self) -> bool:
        """Whether a page has a request in flight (long polls and streams aside); settling waits for it."""
        return self._requests.loading()

    async def close(self) -> None:
        await self._driver.close()

    async def page(self) -> Page:
        """The active tab (see :meth:`TabSet.page`)."""
        return await self.tabset.page()

    def current_url(self) -> str | None:
        """The active tab's URL as Playwright last saw it (no round trip; None before any browser use)."""
        active = self.tabset.active
        return active.url if active is not None else None

    async def navigate(self, url: str, wait_until: str, timeout_ms: int) -> Navigated:
        return await navigation.navigate_tab(self.page, url, wait_until, timeout_ms, self.downloads)

    async def history(self, direction: str, timeout_ms: int) -> PageInfo:
        return await navigation.history(await self.page(), direction, timeout_ms)

    async def info(self) -> PageInfo:
        return await navigation.info_of(await self.page())

    async def info_at_hand(self) -> AtHand:
        """The active tab's URL and title without starting the driver: Playwright's view when it is
        connected, else DevTools' ``/json/list`` (its first page: Chromium lists the most recently
        active first). Empty when neither answers."""
        if self.connected:
            info = await self.info()
            return AtHand(url=info["url"], title=info["title"])
        try:
            listed = (await devtools.get(self._cdp_url, "/json/list", 1.0)).json()
        except (ActionError, ValueError):
            return {}
        for target in listed if isinstance(listed, list) else []:
            if isinstance(target, dict) and target.get("type") == "page":
                url, title = target.get("url"), target.get("title")
                return AtHand(url=url if isinstance(url, str) else None, title=title if isinstance(title, str) else "")
        return {}

    async def focused_page(self) -> Page:
        """The tab X keyboard input reaches: the one on screen (:meth:`page` prefers the focused tab)."""
        return await self.page()

    async def type_text(self, text: str, delay_ms: int) -> None:
        """Key events for ``text`` over CDP, into the focused tab."""
        page = await self.focused_page()
        try:
            await page.keyboard.type(text, delay=delay_ms)
        except PlaywrightError as exc:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, exc.message.splitlines()[0]) from None

    async def tabs(self) -> TabList:
        return await self.tabset.listed()

    async def tab_new(self, url: str | None) -> TabShown:
        return await self.tabset.new(url)

    async def tab_switch(self, ref: str | int) -> TabShown:
        return await self.tabset.switch(ref)

    async def tab_close(self, ref: str | int | None) -> TabClosed:
        return await self.tabset.close(ref)


async def _target_id(page: Page) -> str | None:
    """Chromium's id for the page's target (None if it cannot say: the page is closing)."""
    try:
        session = await page.context.new_cdp_session(page)
        try:
            info = await session.send("Target.getTargetInfo")
        finally:
            await session.detach()
    except PlaywrightError:
        return None
    target = info.get("targetInfo", {}).get("targetId")
    return target if isinstance(target, str) else None
