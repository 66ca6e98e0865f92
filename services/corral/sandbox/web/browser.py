"""Chromium through Playwright over CDP: navigation, page info and tabs.

The init restarts Chromium when it dies; the connection is then dropped and
made again on the next call, so a browser crash costs one failed action at most.

The Playwright driver (a node process, about 80 MiB PSS) is started on first need and stopped
after ``idle_stop_s`` without a browser call: an idle session does not hold it. Chromium and its
tabs are not the driver's, so they stay as they are across a stop; the next browser call starts
the driver again (about 0.3 s) and finds them. What can be read without it (the active tab's URL
and title, for the recording) is read from DevTools' ``/json/list`` instead (:meth:`Browser.info_at_hand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# Playwright's errors alone at import: its API (about 90 ms of every cold start's controller, on CPUs
# Chromium is starting on) is imported with the driver, on the first browser call (:meth:`Browser.connect`).
from playwright._impl._errors import Error as PlaywrightError
from playwright._impl._errors import TimeoutError as PlaywrightTimeout

from corral.errors import ActionError, ErrorCode
from corral.sandbox.web import devtools
from corral.sandbox.web.tabs import FrontTab, LastPage, page_targets

if TYPE_CHECKING:
    from playwright.async_api import Browser as PWBrowser
    from playwright.async_api import BrowserContext, Page, Playwright, Request, Response

log = logging.getLogger(__name__)

_SETTLE_ERROR_PAGE_MS = 3_000
# Input sent before a new document's first frame is dropped. With a 2 s wait, a CI run of eight
# sessions starting at once on two cores lost a click-then-type: so the wait is long (a visible page
# that is not starved paints far sooner, and the warning below says when it was not enough).
_PAINT_TIMEOUT_S = 10.0
_TWO_FRAMES_JS = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"
# A request pending longer than this is a long poll or a stream, not page loading.
_LOADING_REQUEST_S = 1.5


_BROWSER_PATH = re.compile(r"/devtools/browser/[A-Za-z0-9-]{1,64}")


def pinned_endpoint(cdp_url: str, named: object) -> str | None:
    """The browser WebSocket that ``/json/version`` named, if it is on the DevTools address itself.

    Chromium runs as the agent's uid, so a command can kill it and answer on its port before it
    comes back: what that answer names must never send the controller's Playwright (uid corral)
    anywhere else, such as the controller's own port or the proxy's control port.
    """
    if not isinstance(named, str):
        return None
    expected, given = urllib.parse.urlsplit(cdp_url), urllib.parse.urlsplit(named)
    if given.scheme != "ws" or given.hostname != expected.hostname or given.port != expected.port:
        return None
    if given.query or given.fragment or given.username or not _BROWSER_PATH.fullmatch(given.path):
        return None
    return f"ws://{expected.hostname}:{expected.port}{given.path}"


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
    ) -> None:
        self._cdp_url = cdp_url
        self._connect_timeout_s = connect_timeout_s
        self._idle_stop_s = idle_stop_s
        self._busy = busy
        self._stopped = stopped  # called after an idle stop (the controller gives freed memory back)
        self._playwright: Playwright | None = None
        self._browser: PWBrowser | None = None
        self._lock = asyncio.Lock()
        self._active: Page | None = None
        self._front = FrontTab()  # which tab is on screen, asked where the pages cannot answer for it
        # Shared with the CDP relays: a native close and a CDP close at once cannot close the last two.
        self.last_page = LastPage(functools.partial(page_targets, cdp_url))
        self._ids: dict[Page, str] = {}
        self._next_id = itertools.count(1)
        # Tab ids by Chromium's target id, kept across an idle stop: the same tab keeps its id.
        self._by_target: dict[str, str] = {}
        self._pending: dict[Request, float] = {}
        self._last_use = time.monotonic()
        self._stopping = False  # the idle stop drops the connection on purpose: no warning for it
        self._reaper: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self.stops = 0  # idle stops so far (for tests and logs)

    async def devtools_answer(self) -> bool:
        """Whether Chromium's DevTools endpoint answers (readiness; the Playwright link may still be forming)."""
        try:
            answer = await devtools.get(self._cdp_url, "/json/version", 1.0)
        except ActionError:
            return False
        return answer.status == 200

    async def _browser_endpoint(self) -> str:
        """The browser's DevTools WebSocket, pinned to the DevTools address (see :func:`pinned_endpoint`)."""
        try:
            answer = await devtools.get(self._cdp_url, "/json/version", self._connect_timeout_s)
            named = answer.json().get("webSocketDebuggerUrl")
        except (ActionError, ValueError, AttributeError) as exc:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium's DevTools did not answer: {exc!r}") from None
        endpoint = pinned_endpoint(self._cdp_url, named)
        if endpoint is None:
            log.warning("DevTools named a browser endpoint off its own address: %r", named)
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "Chromium's DevTools named an unexpected endpoint")
        return endpoint

    @property
    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    @property
    def driver_running(self) -> bool:
        return self._playwright is not None

    def wanted(self) -> None:
        """An action that may make the page load (a click, a key) is running: start the driver in the
        background if it is stopped, so the settle after it and the next ones see the page's requests
        (:meth:`loading`). Nothing waits for it; a failure shows at the next browser call."""
        self._last_use = time.monotonic()
        if self.connected or (self._starting is not None and not self._starting.done()):
            return
        self._starting = asyncio.create_task(self._start_quietly())

    async def _start_quietly(self) -> None:
        with contextlib.suppress(ActionError):
            await self.connect()

    async def connect(self) -> PWBrowser:
        self._last_use = time.monotonic()
        async with self._lock:
            self._last_use = time.monotonic()
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            try:
                if self._playwright is None:
                    self._playwright = await _start_playwright()
                # Without Playwright's default overrides: its focus emulation makes every tab it attaches
                # to visible and focused, so no tab could say whether it is the one on screen (tabs.py).
                browser = await self._playwright.chromium.connect_over_cdp(
                    await self._browser_endpoint(), timeout=self._connect_timeout_s * 1000, no_defaults=True
                )
            except PlaywrightError as exc:
                raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium is not reachable: {exc.message}") from None
            except Exception as exc:  # the Playwright driver itself failed to start
                log.exception("the Playwright driver failed")
                raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Playwright driver failed: {exc}") from None
            browser.on("disconnected", self._forget)
            await _downloads_as_the_policy_says(browser)
            for context in browser.contexts:
                self._track(context)
            self._browser = browser
            self._active = None
            self._front.forget()
            self._ids.clear()
            self._last_use = time.monotonic()
            if self._idle_stop_s > 0 and (self._reaper is None or self._reaper.done()):
                self._reaper = asyncio.create_task(self._stop_when_idle())
            return browser

    async def _stop_when_idle(self) -> None:
        """Stop the driver once no browser call has come for ``idle_stop_s`` (and no action runs)."""
        while self._playwright is not None:
            idle = time.monotonic() - self._last_use
            if idle < self._idle_stop_s or self._busy() or self._lock.locked():
                await asyncio.sleep(max(0.5, self._idle_stop_s - idle))
                continue
            async with self._lock:
                if time.monotonic() - self._last_use < self._idle_stop_s or self._busy():
                    continue
                await self._stop_driver()
                self.stops += 1
                self._stopped()
                log.info("stopped the Playwright driver after %.0f s unused; Chromium keeps its tabs", idle)
            return

    async def _stop_driver(self) -> None:
        """End the driver (node) and with it the connection; Chromium and its pages are left as they are.
        Not ``Browser.close()``: over CDP that closes the contexts Playwright made."""
        self._stopping = True
        try:
            if self._playwright is not None:
                await self._playwright.stop()
        except Exception as exc:  # it is going either way
            log.warning("the Playwright driver did not stop cleanly: %r", exc)
        finally:
            self._playwright = None
            self._browser = None
            self._active = None
            self._front.forget()
            self._ids.clear()
            self._pending.clear()
            self._stopping = False

    def _track(self, context: BrowserContext) -> None:
        context.on("request", self._request_started)
        context.on("requestfinished", self._request_ended)
        context.on("requestfailed", self._request_ended)

    def _request_started(self, request: Request) -> None:
        self._pending[request] = time.monotonic()

    def _request_ended(self, request: Request) -> None:
        self._pending.pop(request, None)

    def loading(self) -> bool:
        """Whether a page has a request in flight (long polls and streams aside); settling waits for it."""
        if not self._pending:
            return False
        cutoff = time.monotonic() - _LOADING_REQUEST_S
        return any(started > cutoff for started in self._pending.values())

    def _forget(self, _browser: PWBrowser) -> None:
        if not self._stopping:
            log.warning("lost the connection to Chromium; reconnecting on the next browser action")
        self._browser = None
        self._active = None
        self._front.forget()
        self._ids.clear()
        self._pending.clear()

    async def close(self) -> None:
        for task in (self._reaper, self._starting):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._reaper, self._starting) if t is not None), return_exceptions=True)
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None

    async def _tab_id(self, page: Page) -> str:
        if page not in self._ids:
            target = await _target_id(page)
            if target is None:
                self._ids[page] = f"tab-{next(self._next_id)}"
            else:
                self._ids[page] = self._by_target.setdefault(target, f"tab-{next(self._next_id)}")
        return self._ids[page]

    async def _pages(self) -> list[Page]:
        """The open tabs in the order this controller first saw them (by their ids), the same after a
        driver restart: a new connection lists its pages in the order Chromium reports its targets,
        which is not the old one's, and an agent's tab indexes must not move under it."""
        browser = await self.connect()
        pages = [page for context in browser.contexts for page in context.pages if not page.is_closed()]
        for page in pages:
            await self._tab_id(page)  # a tab not seen yet gets the next id, in the connection's order
        return sorted(pages, key=self._seen_at)

    def _seen_at(self, page: Page) -> int:
        # Last when its id is gone: the connection dropped meanwhile (it forgets them all).
        tab = self._ids.get(page)
        return int(tab.removeprefix("tab-")) if tab is not None else sys.maxsize

    async def page(self) -> Page:
        """The active tab: the one on screen (a popup a page opened, a tab a CDP client opened or
        brought to the front, the next one Chromium shows when the front one closed), else the one
        named last (switched to or opened here), else the first. With one tab, no question asked."""
        pages = await self._pages()
        if len(pages) > 1:
            self._active = await self._front.pick(pages, self._active)
            return self._active
        if pages:
            self._active = pages[0]
            return pages[0]
        self._active = await (await self._context()).new_page()
        return self._active

    async def _context(self) -> BrowserContext:
        browser = await self.connect()
        if browser.contexts:
            return browser.contexts[0]
        context = await browser.new_context()
        self._track(context)
        return context

    async def _painted(self, page: Page) -> None:
        """Wait until the page has produced a frame: input sent before that can be dropped by Chromium."""
        with contextlib.suppress(PlaywrightError):
            try:
                await asyncio.wait_for(page.evaluate(_TWO_FRAMES_JS), _PAINT_TIMEOUT_S)
            except TimeoutError:
                log.warning("%s made no frame within %.0f s: input sent now may be lost", page.url, _PAINT_TIMEOUT_S)

    def current_url(self) -> str | None:
        """The active tab's URL as Playwright last saw it (no round trip; None before any browser use)."""
        return self._active.url if self._active is not None else None

    async def _info(self, page: Page) -> dict[str, Any]:
        try:
            title = await page.title()
        except PlaywrightError:
            title = ""  # the page is between documents
        return {"url": page.url, "title": title}

    async def navigate(self, url: str, wait_until: str, timeout_ms: int) -> dict[str, Any]:
        page = await self.page()
        try:
            response = await self._goto(page, url, wait_until, timeout_ms)
        except PlaywrightTimeout:
            raise ActionError(
                ErrorCode.TIMEOUT, f"{url} did not reach {wait_until!r} within {timeout_ms} ms", field="action.url"
            ) from None
        except PlaywrightError as exc:
            # Let Chromium commit its error page now, so it cannot cut the next navigation short.
            with contextlib.suppress(PlaywrightError):
                await page.wait_for_load_state("load", timeout=_SETTLE_ERROR_PAGE_MS)
            raise ActionError(ErrorCode.NAVIGATION_FAILED, exc.message.splitlines()[0], field="action.url") from None
        await self._painted(page)
        info = await self._info(page)
        info["status"] = None if response is None else response.status
        return info

    @staticmethod
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

    async def history(self, direction: str, timeout_ms: int) -> dict[str, Any]:
        page = await self.page()
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
        await self._painted(page)
        return await self._info(page)

    async def info(self) -> dict[str, Any]:
        return await self._info(await self.page())

    async def info_at_hand(self) -> dict[str, Any]:
        """The active tab's URL and title without starting the driver: Playwright's view when it is
        connected, else DevTools' ``/json/list`` (its first page: Chromium lists the most recently
        active first). Empty when neither answers."""
        if self.connected:
            return await self.info()
        try:
            listed = (await devtools.get(self._cdp_url, "/json/list", 1.0)).json()
        except (ActionError, ValueError):
            return {}
        for target in listed if isinstance(listed, list) else []:
            if isinstance(target, dict) and target.get("type") == "page":
                url, title = target.get("url"), target.get("title")
                return {"url": url if isinstance(url, str) else None, "title": title if isinstance(title, str) else ""}
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

    async def tabs(self) -> dict[str, Any]:
        pages = await self._pages()
        active = await self.page() if pages else None
        listed = []
        for index, page in enumerate(pages):
            entry = {"index": index, "id": await self._tab_id(page), "active": page is active, **await self._info(page)}
            listed.append(entry)
        return {"tabs": listed}

    async def _find(self, ref: str | int) -> Page:
        pages = await self._pages()
        if isinstance(ref, int):
            if ref < len(pages):
                return pages[ref]
        else:
            for page in pages:
                if await self._tab_id(page) == ref:
                    return page
        raise ActionError(ErrorCode.NO_SUCH_TAB, f"no tab {ref!r}; there are {len(pages)} tabs", field="action.tab")

    async def tab_new(self, url: str | None) -> dict[str, Any]:
        page = await (await self._context()).new_page()
        await page.bring_to_front()
        self._active = page
        if url:
            try:
                await page.goto(url)
            except PlaywrightError as exc:
                raise ActionError(
                    ErrorCode.NAVIGATION_FAILED, exc.message.splitlines()[0], field="action.url"
                ) from None
        return {"id": await self._tab_id(page), **await self._info(page)}

    async def tab_switch(self, ref: str | int) -> dict[str, Any]:
        page = await self._find(ref)
        await page.bring_to_front()
        self._active = page
        await self._painted(page)
        return {"id": await self._tab_id(page), **await self._info(page)}

    async def tab_close(self, ref: str | int | None) -> dict[str, Any]:
        page = await self.page() if ref is None else await self._find(ref)
        closed = await self._tab_id(page)
        target = next((t for t, tab in self._by_target.items() if tab == closed), None) or await _target_id(page)
        # Chromium exits with its last window: when this is the last open page (a CDP client may be
        # closing the other one right now), a blank tab first. Judged with the CDP relays' closings.
        if await self.last_page.refuses(target):
            await page.context.new_page()
            if await self.last_page.refuses(target):
                raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "Chromium's DevTools cannot tell which pages are open")
        try:
            await page.close()
        except PlaywrightError:
            if target is not None:
                self.last_page.closed(target)
            raise
        self._ids.pop(page, None)
        self._front.forget(page)
        if self._active is page:
            self._active = None
        remaining = await self._pages()
        if remaining:
            await (await self.page()).bring_to_front()
        return {"closed": closed, "tabs": len(remaining)}


async def _start_playwright() -> Playwright:
    """Playwright's driver, started; its API imported first on a thread, so the event loop serves meanwhile."""
    api = await asyncio.to_thread(importlib.import_module, "playwright.async_api")
    started: Playwright = await api.async_playwright().start()
    return started


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


async def _downloads_as_the_policy_says(browser: PWBrowser) -> None:
    """Give downloads back to Chromium's own handling, where the managed policy saves them in the
    agent's Downloads folder under their own names: connecting over CDP, Playwright points the
    default context's downloads at a temporary folder of the controller's (which Chromium, running
    as the agent, cannot write) and names them by GUID."""
    try:
        session = await browser.new_browser_cdp_session()
        try:
            await session.send("Browser.setDownloadBehavior", {"behavior": "default"})
        finally:
            await session.detach()
    except PlaywrightError as exc:
        log.warning("downloads stay as Playwright set them: %s", exc.message)
