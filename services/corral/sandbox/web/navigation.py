"""Navigation in one tab: going to a URL, back, forward and reload, each waiting for the page's first
frame; and what a tab shows (its URL and title)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NotRequired, TypedDict

from playwright._impl._errors import Error as PlaywrightError
from playwright._impl._errors import TimeoutError as PlaywrightTimeout

from corral.contracts.downloads import FINISHED
from corral.errors import ActionError, ErrorCode
from corral.protocol.downloads import Download
from corral.sandbox.web.downloadbook import DownloadBook

if TYPE_CHECKING:
    from playwright.async_api import Page, Response

log = logging.getLogger("corral.sandbox.web.browser")  # the name the logs have always had

_SETTLE_ERROR_PAGE_MS = 3_000
# Input sent before a new document's first frame is dropped. With a 2 s wait, a CI run of eight
# sessions starting at once on two cores lost a click-then-type: so the wait is long (a visible page
# that is not starved paints far sooner, and the warning below says when it was not enough).
PAINT_TIMEOUT_S = 10.0
_TWO_FRAMES_JS = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"


class PageInfo(TypedDict):
    """What a tab shows."""

    url: str
    title: str


class Navigated(PageInfo):
    """A navigation's result: the page, and its main response's status (None: none came, such as
    a navigation within the document)."""

    status: int | None
    download: NotRequired[Download]  # the URL was an attachment: what the browser saved instead


async def info_of(page: Page) -> PageInfo:
    try:
        title = await page.title()
    except PlaywrightError:
        title = ""  # the page is between documents
    return PageInfo(url=page.url, title=title)


async def painted(page: Page) -> None:
    """Wait until the page has produced a frame: input sent before that can be dropped by Chromium."""
    with contextlib.suppress(PlaywrightError):
        try:
            async with asyncio.timeout(PAINT_TIMEOUT_S):
                await page.evaluate(_TWO_FRAMES_JS)
        except TimeoutError:
            log.warning("%s made no frame within %.0f s: input sent now may be lost", page.url, PAINT_TIMEOUT_S)


async def navigate(page: Page, url: str, wait_until: str, timeout_ms: int) -> Navigated:
    try:
        response = await _goto(page, url, wait_until, timeout_ms)
    except PlaywrightTimeout:
        raise ActionError(
            ErrorCode.TIMEOUT, f"{url} did not reach {wait_until!r} within {timeout_ms} ms", field="action.url"
        ) from None
    except PlaywrightError as exc:
        # Let Chromium commit its error page now, so it cannot cut the next navigation short.
        with contextlib.suppress(PlaywrightError):
            await page.wait_for_load_state("load", timeout=_SETTLE_ERROR_PAGE_MS)
        raise ActionError(ErrorCode.NAVIGATION_FAILED, exc.message.splitlines()[0], field="action.url") from None
    await painted(page)
    info = await info_of(page)
    return Navigated(url=info["url"], title=info["title"], status=None if response is None else response.status)


# Playwright's words when the URL answered with an attachment: the browser saves it instead of showing it.
DOWNLOAD_STARTING = "Download is starting"
# How long a navigation that became a download waits for Chromium's report of it (on the downloads
# watch's own socket, so it may come after Playwright's error).
_BEGIN_WAIT_S = 10.0


async def navigate_or_download(
    page: Page, url: str, wait_until: str, timeout_ms: int, downloads: DownloadBook
) -> Navigated:
    """:func:`navigate`, and when the URL is an attachment, the download it became (waited for until
    it ends, within ``timeout_ms``) on the tab's page as it stayed, instead of a failure."""
    deadline = time.monotonic() + timeout_ms / 1000
    known = {record.id for record in downloads.listing().downloads}
    try:
        return await navigate(page, url, wait_until, timeout_ms)
    except ActionError as exc:
        if exc.code != ErrorCode.NAVIGATION_FAILED or DOWNLOAD_STARTING not in exc.message:
            raise
        failure = exc
    # A download of this navigation: one that began since it started (a redirect may change its URL).
    found = await downloads.wait_for(lambda d: d.id not in known, min(_BEGIN_WAIT_S, _left(deadline)))
    if found is None:
        failure.message += " (the browser downloads it: see the session's downloads)"
        raise failure
    ended = await downloads.wait_for(lambda d: d.id == found.id and d.state in FINISHED, _left(deadline))
    info = await info_of(page)
    return Navigated(
        url=info["url"], title=info["title"], status=None, download=ended or downloads.get(found.id) or found
    )


# Playwright's words (TargetClosedError's) when the page closed under a call.
TARGET_CLOSED = "Target page, context or browser has been closed"
# How long a call's failure on a closing page waits for Playwright's close event, which may follow it.
_CLOSE_EVENT_WAIT_MS = 1_000


async def navigate_tab(
    pick: Callable[[], Awaitable[Page]], url: str, wait_until: str, timeout_ms: int, downloads: DownloadBook
) -> Navigated:
    """:func:`navigate_or_download` on the tab ``pick`` gives, and once more on the next one when that
    tab closed under it: a CDP client (Puppeteer closing its pages) closed it a moment before Playwright
    told this connection, which still listed it. The agent's active tab is then the one left on screen."""
    page = await pick()
    try:
        return await navigate_or_download(page, url, wait_until, timeout_ms, downloads)
    except ActionError as exc:
        if exc.code != ErrorCode.NAVIGATION_FAILED or TARGET_CLOSED not in exc.message or not await _closed(page):
            raise
    log.info("the active tab closed under a navigation: it goes to the tab now on screen")
    return await navigate_or_download(await pick(), url, wait_until, timeout_ms, downloads)


async def _closed(page: Page) -> bool:
    """Whether ``page`` closed, its close event waited for briefly."""
    if not page.is_closed():
        with contextlib.suppress(PlaywrightError):  # Playwright's TimeoutError is one too
            await page.wait_for_event("close", timeout=_CLOSE_EVENT_WAIT_MS)
    return page.is_closed()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


async def _goto(page: Page, url: str, wait_until: str, timeout_ms: int) -> Response | None:
    for attempt in range(3):
        try:
            return await page.goto(url, wait_until=wait_until, timeout=timeout_ms)  # type: ignore[arg-type]
        except PlaywrightError as exc:
            # A late navigation (an error page committing, a script redirect) cut this one short:
            # let it finish and try again, unless it was to where we were going anyway.
            if "interrupted by another navigation" not in exc.message or attempt == 2:
                raise
            await page.wait_for_load_state("load", timeout=timeout_ms)
            if page.url == url:
                return None
    return None


async def history(page: Page, direction: str, timeout_ms: int) -> PageInfo:
    """``back``, ``forward`` or (anything else) a reload."""
    try:
        if direction == "back":
            await page.go_back(timeout=timeout_ms)
        elif direction == "forward":
            await page.go_forward(timeout=timeout_ms)
        else:
            await page.reload(timeout=timeout_ms)
    except PlaywrightTimeout:
        raise ActionError(ErrorCode.TIMEOUT, f"{direction} did not finish within {timeout_ms} ms") from None
    except PlaywrightError as exc:
        raise ActionError(ErrorCode.NAVIGATION_FAILED, exc.message.splitlines()[0]) from None
    await painted(page)
    return await info_of(page)
