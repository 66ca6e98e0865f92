"""The open tabs as the agent sees them: their ids and order, the active one, and the tab actions
(list, new, switch, close)."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypedDict

from playwright._impl._errors import Error as PlaywrightError

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web.navigation import PageInfo, info_of, painted
from corral.sandbox.web.tabs import FrontTab, LastPage

if TYPE_CHECKING:
    from playwright.async_api import Browser as PWBrowser
    from playwright.async_api import BrowserContext, Page


# How long a listing waits for a page Chromium has and this connection was not told of yet.
CATCH_UP_S = 2.0


def _open_pages(browser: PWBrowser) -> list[Page]:
    return [page for context in browser.contexts for page in context.pages if not page.is_closed()]


class Tab(PageInfo):
    """One tab of :class:`TabList`."""

    index: int
    id: str
    active: bool


class TabList(TypedDict):
    tabs: list[Tab]


class TabShown(PageInfo):
    """A tab opened or switched to: its id, and what it shows."""

    id: str


class TabClosed(TypedDict):
    closed: str  # its id
    tabs: int  # how many are left


class TabSet:
    """The tabs of the connection ``connect`` gives; contexts it makes go to ``track`` (the request
    tracking). ``target_of`` names a page's Chromium target, by which a tab keeps its id across a
    new connection. ``last_page`` is shared with the CDP relays (see :class:`LastPage`)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[PWBrowser]],
        track: Callable[[BrowserContext], None],
        target_of: Callable[[Page], Awaitable[str | None]],
        last_page: LastPage,
    ) -> None:
        self._connect = connect
        self._track = track
        self._target_of = target_of
        self.last_page = last_page
        self.active: Page | None = None
        self._front = FrontTab()  # which tab is on screen, asked where the pages cannot answer for it
        self._ids: dict[Page, str] = {}
        self._next_id = itertools.count(1)
        # Tab ids by Chromium's target id, kept across an idle stop: the same tab keeps its id.
        self._by_target: dict[str, str] = {}

    def forget(self) -> None:
        """The connection went (or a new one came): its pages and what was asked of them are gone;
        the ids by target stay."""
        self.active = None
        self._front.forget()
        self._ids.clear()

    async def tab_id(self, page: Page) -> str:
        if page not in self._ids:
            target = await self._target_of(page)
            if target is None:
                self._ids[page] = f"tab-{next(self._next_id)}"
            else:
                self._ids[page] = self._by_target.setdefault(target, f"tab-{next(self._next_id)}")
        return self._ids[page]

    async def pages(self) -> list[Page]:
        """The open tabs in the order this controller first saw them (by their ids), the same after a
        driver restart: a new connection lists its pages in the order Chromium reports its targets,
        which is not the old one's, and an agent's tab indexes must not move under it."""
        browser = await self._connect()
        pages = _open_pages(browser)
        if not pages and browser.contexts and await self.last_page.pages_open():
            pages = await self._caught_up(browser)
        for page in pages:
            await self.tab_id(page)  # a tab not seen yet gets the next id, in the connection's order
        return sorted(pages, key=self.seen_at)

    @staticmethod
    async def _caught_up(browser: PWBrowser) -> list[Page]:
        """The pages once this connection is told of the one Chromium lists (the blank tab a CDP
        client's close of the last page opened a moment ago: LastPage.make_way), waited for briefly;
        never a page of its own opened beside it."""
        context = browser.contexts[0]
        arrived = asyncio.Event()

        def seen(_: Page) -> None:
            arrived.set()

        context.on("page", seen)
        try:
            if not _open_pages(browser):
                async with asyncio.timeout(CATCH_UP_S):
                    await arrived.wait()
        except TimeoutError:
            pass  # told of none: as before, the caller opens one
        finally:
            context.remove_listener("page", seen)
        return _open_pages(browser)

    def seen_at(self, page: Page) -> int:
        """Where ``page`` sorts: last when its id is gone (the connection dropped meanwhile)."""
        tab = self._ids.get(page)
        return int(tab.removeprefix("tab-")) if tab is not None else sys.maxsize

    async def page(self) -> Page:
        """The active tab: the one on screen (a popup a page opened, a tab a CDP client opened or
        brought to the front, the next one Chromium shows when the front one closed), else the one
        named last (switched to or opened here), else the first. With one tab, no question asked."""
        pages = await self.pages()
        if len(pages) > 1:
            self.active = await self._front.pick(pages, self.active)
            return self.active
        if pages:
            self.active = pages[0]
            return pages[0]
        self.active = await (await self._context()).new_page()
        return self.active

    async def _context(self) -> BrowserContext:
        browser = await self._connect()
        if browser.contexts:
            return browser.contexts[0]
        context = await browser.new_context()
        self._track(context)
        return context

    async def _find(self, ref: str | int) -> Page:
        pages = await self.pages()
        if isinstance(ref, int):
            if ref < len(pages):
                return pages[ref]
        else:
            for page in pages:
                if await self.tab_id(page) == ref:
                    return page
        raise ActionError(ErrorCode.NO_SUCH_TAB, f"no tab {ref!r}; there are {len(pages)} tabs", field="action.tab")

    async def listed(self) -> TabList:
        pages = await self.pages()
        active = await self.page() if pages else None
        listed: list[Tab] = []
        for index, page in enumerate(pages):
            tab_id, info = await self.tab_id(page), await info_of(page)
            listed.append(Tab(index=index, id=tab_id, active=page is active, url=info["url"], title=info["title"]))
        return TabList(tabs=listed)

    async def _shown(self, page: Page) -> TabShown:
        tab_id, info = await self.tab_id(page), await info_of(page)
        return TabShown(id=tab_id, url=info["url"], title=info["title"])

    async def new(self, url: str | None) -> TabShown:
        page = await (await self._context()).new_page()
        await page.bring_to_front()
        self.active = page
        if url:
            try:
                await page.goto(url)
            except PlaywrightError as exc:
                raise ActionError(
                    ErrorCode.NAVIGATION_FAILED, exc.message.splitlines()[0], field="action.url"
                ) from None
        return await self._shown(page)

    async def switch(self, ref: str | int) -> TabShown:
        page = await self._find(ref)
        await page.bring_to_front()
        self.active = page
        await painted(page)
        return await self._shown(page)

    async def close(self, ref: str | int | None) -> TabClosed:
        page = await self.page() if ref is None else await self._find(ref)
        closed = await self.tab_id(page)
        target = next((t for t, tab in self._by_target.items() if tab == closed), None) or await self._target_of(page)
        await self._keep_one_open(page, target)
        try:
            await page.close()
        except PlaywrightError:
            if target is not None:
                self.last_page.closed(target)
            raise
        self._ids.pop(page, None)
        self._front.forget(page)
        if self.active is page:
            self.active = None
        remaining = await self.pages()
        if remaining:
            await (await self.page()).bring_to_front()
        return TabClosed(closed=closed, tabs=len(remaining))

    async def _keep_one_open(self, page: Page, target: str | None) -> None:
        """Chromium exits with its last window: when ``page`` is the last open page (a CDP client may
        be closing the other one right now), a blank tab first. Judged with the CDP relays' closings."""
        if await self.last_page.refuses(target):
            await page.context.new_page()
            if await self.last_page.refuses(target):
                raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "Chromium's DevTools cannot tell which pages are open")
